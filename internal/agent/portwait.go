package agent

import (
	"bufio"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// portListening reports whether some socket in the sandbox listens on TCP
// port. It reads /proc/net/tcp and /proc/net/tcp6 (gVisor's netstack
// provides both) for a socket in state LISTEN (0A), so it never touches the
// server; where those files are missing it falls back to connect().
func portListening(port int) bool {
	found, readable := false, false
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		ok, err := procNetListening(f, port)
		if err == nil {
			readable = true
		}
		if ok {
			found = true
			break
		}
	}
	if found || readable {
		return found
	}
	for _, addr := range []string{"127.0.0.1", "::1"} {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, strconv.Itoa(port)), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return true
		}
	}
	return false
}

// procNetListening scans one /proc/net/tcp{,6} table: each row is
// "sl local_address rem_address st ...", local_address is HEXIP:HEXPORT.
func procNetListening(path string, port int) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	want := strings.ToUpper(strconv.FormatInt(int64(port), 16))
	for len(want) < 4 {
		want = "0" + want
	}
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[3] != "0A" {
			continue
		}
		if i := strings.LastIndexByte(fields[1], ':'); i >= 0 && strings.ToUpper(fields[1][i+1:]) == want {
			return true, nil
		}
	}
	return false, sc.Err()
}
