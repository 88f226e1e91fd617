package agent

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// enospcReason names the full filesystem of a command that failed with
// ENOSPC: the writable layer (the sandbox's disk limit) or a volume (its
// size limit).
func enospcReason(diskLimit int64, diskPath string) string {
	if !diskFull(diskPath) {
		for _, mp := range volumeMountPoints() {
			var st unix.Statfs_t
			// Blocks == 0: a pseudo filesystem (nsfs, proc), never "full".
			if unix.Statfs(mp, &st) != nil || st.Blocks == 0 || st.Bavail*uint64(st.Bsize) >= 1<<20 {
				continue
			}
			return fmt.Sprintf("volume at %s is full (size limit %s; free space in it or use a larger volume)", mp, formatBytes(int64(st.Blocks)*st.Bsize))
		}
	}
	return diskReason(diskLimit)
}

// volumeMountPoints returns the read-write mount points inside the sandbox
// that are not part of the standard container layout: cella volumes
// (POST /volumes, mounted at create). The "user" Landlock ruleset grants
// them read/write like /home, so the template user can write the volumes it
// was given; read-only volumes stay read-only through their mount.
func volumeMountPoints() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20) // grows from 4 KiB as lines need
	for sc.Scan() {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		rw := false
		for _, o := range strings.Split(fields[5], ",") {
			if o == "rw" {
				rw = true
			}
		}
		if !rw || mp == "/" || reservedMountPoint(mp) {
			continue
		}
		out = append(out, mp)
	}
	return out
}

func reservedMountPoint(p string) bool {
	for _, r := range []string{"/proc", "/sys", "/dev", "/run/cella", "/.cella"} {
		if p == r || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

// unescapeMountinfo undoes mountinfo's \NNN escapes.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, ok := octal3(s[i+1 : i+4]); ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func octal3(s string) (byte, bool) {
	if len(s) != 3 {
		return 0, false
	}
	var v int
	for _, c := range s {
		if c < '0' || c > '7' {
			return 0, false
		}
		v = v*8 + int(c-'0')
	}
	return byte(v), v < 256
}
