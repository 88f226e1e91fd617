package network

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cella-sandbox/cella/internal/rootfs"
)

// Addresses that exist nowhere on this machine: traffic to them can only
// end up at a slot's listeners (or be dropped in O).
const (
	fakeHTTP  = "10.99.99.99:80"
	fakeHTTPS = "192.0.2.10:443"
	fakeDNS   = "192.0.2.53:53"
)

// blocked is how long a probe waits before calling a packet dropped.
const blocked = 300 * time.Millisecond

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func testConfig(t testing.TB, pool int) Config {
	cfg := DefaultConfig()
	cfg.RunDir = t.TempDir()
	cfg.PoolSize = pool
	return cfg
}

func newManager(t testing.TB, cfg Config) *Manager {
	t.Helper()
	log := slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m, err := New(cfg, log)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m
}

func acquire(t testing.TB, m *Manager) *Slot {
	t.Helper()
	s, err := m.Acquire(context.Background())
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Release(); err != nil {
			t.Errorf("Release: %v", err)
		}
	})
	return s
}

// inNS runs fn on an OS thread that has joined the namespace at path.
// Sockets fn creates stay in that namespace after it returns.
func inNS(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- err // stay locked: the thread dies with the goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func dialFrom(path, network, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := inNS(path, func() (err error) {
		c, err = net.DialTimeout(network, addr, timeout)
		return err
	})
	return c, err
}

func listenPacketIn(t *testing.T, path, network, addr string) net.PacketConn {
	t.Helper()
	var pc net.PacketConn
	if err := inNS(path, func() (err error) {
		pc, err = net.ListenPacket(network, addr)
		return err
	}); err != nil {
		t.Fatalf("listen %s %s in %s: %v", network, addr, path, err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc
}

func acceptWithin(l net.Listener, d time.Duration) (net.Conn, error) {
	_ = l.(*net.TCPListener).SetDeadline(time.Now().Add(d))
	return l.Accept()
}

func readWithin(pc net.PacketConn, d time.Duration) ([]byte, net.Addr, error) {
	_ = pc.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 1500)
	n, from, err := pc.ReadFrom(buf)
	return buf[:n], from, err
}

func mountsUnder(t testing.TB, dir string) []string {
	t.Helper()
	out, err := rootfs.FindMounts(dir)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func nsFilesIn(t testing.TB, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if e.Name() != lockName {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestTCPRedirect(t *testing.T) {
	needRoot(t)
	s := acquire(t, newManager(t, testConfig(t, 0)))
	for _, dst := range []string{fakeHTTP, fakeHTTPS} {
		c, err := dialFrom(s.NetNSPath, "tcp4", dst, 2*time.Second)
		if err != nil {
			t.Fatalf("dial %s from sandbox: %v", dst, err)
		}
		defer c.Close()
		ac, err := acceptWithin(s.Listener, 2*time.Second)
		if err != nil {
			t.Fatalf("accept connection to %s: %v", dst, err)
		}
		defer ac.Close()
		od, err := OriginalDst(ac)
		if err != nil || od != netip.MustParseAddrPort(dst) {
			t.Fatalf("OriginalDst = %v, %v; want %s", od, err, dst)
		}
		if got, want := ac.RemoteAddr().String(), c.LocalAddr().String(); got != want {
			t.Errorf("proxy sees peer %s, sandbox socket is %s", got, want)
		}
		if got := c.RemoteAddr().String(); got != dst {
			t.Errorf("sandbox believes it is connected to %s, want %s", got, dst)
		}
		t.Logf("sandbox %s -> %s lands on %s, OriginalDst %s", c.LocalAddr(), c.RemoteAddr(), ac.LocalAddr(), od)

		// More than a window's worth each way, to see data really flows.
		up := bytes.Repeat([]byte("sandbox->proxy "), 64<<10)
		down := bytes.Repeat([]byte("proxy->sandbox "), 64<<10)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); _, _ = c.Write(up); _ = c.(*net.TCPConn).CloseWrite() }()
		go func() { defer wg.Done(); _, _ = ac.Write(down); _ = ac.(*net.TCPConn).CloseWrite() }()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_ = ac.SetDeadline(time.Now().Add(10 * time.Second))
		var gotUp, gotDown []byte
		var rerr [2]error
		var rg sync.WaitGroup
		rg.Add(2)
		go func() { defer rg.Done(); gotUp, rerr[0] = io.ReadAll(ac) }()
		go func() { defer rg.Done(); gotDown, rerr[1] = io.ReadAll(c) }()
		rg.Wait()
		wg.Wait()
		if rerr[0] != nil || rerr[1] != nil || !bytes.Equal(gotUp, up) || !bytes.Equal(gotDown, down) {
			t.Fatalf("transfer: up %d/%d bytes (%v), down %d/%d bytes (%v)", len(gotUp), len(up), rerr[0], len(gotDown), len(down), rerr[1])
		}
	}
}

func TestDNSRedirect(t *testing.T) {
	needRoot(t)
	s := acquire(t, newManager(t, testConfig(t, 0)))
	for _, dst := range []string{netip.AddrPortFrom(s.HostIP, 53).String(), fakeDNS} {
		// Unconnected, so the sandbox side sees whatever source the reply
		// really carries.
		pc := listenPacketIn(t, s.NetNSPath, "udp4", ":0")
		query := []byte("query for " + dst)
		if _, err := pc.WriteTo(query, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(dst))); err != nil {
			t.Fatalf("send to %s: %v", dst, err)
		}
		got, from, err := readWithin(s.DNS, 2*time.Second)
		if err != nil || !bytes.Equal(got, query) {
			t.Fatalf("DNS socket read %q from %v, %v; want %q", got, from, err, query)
		}
		wantFrom := netip.AddrPortFrom(s.GuestIP, uint16(pc.LocalAddr().(*net.UDPAddr).Port))
		if from.(*net.UDPAddr).AddrPort() != wantFrom {
			t.Errorf("query source %s, want %s", from, wantFrom)
		}
		answer := []byte("answer to " + dst)
		if _, err := s.DNS.WriteTo(answer, from); err != nil {
			t.Fatalf("answer: %v", err)
		}
		got, rfrom, err := readWithin(pc, 2*time.Second)
		if err != nil || !bytes.Equal(got, answer) {
			t.Fatalf("sandbox read %q from %v, %v; want %q", got, rfrom, err, answer)
		}
		if rfrom.String() != dst {
			t.Errorf("sandbox got the answer from %s, want it from %s", rfrom, dst)
		}
		t.Logf("query %s -> %s arrives on %s from %s; answer reaches the sandbox from %s", pc.LocalAddr(), dst, s.DNS.LocalAddr(), from, rfrom)
	}
}

// TestBlocked checks that everything but redirected TCP and DNS dies in O.
// Listeners opened in O on the probed ports tell "dropped by the firewall"
// apart from "nothing listening"; the last step removes the firewall to show
// the same probes do get through without it.
func TestBlocked(t *testing.T) {
	needRoot(t)
	cfg := testConfig(t, 0)
	s := acquire(t, newManager(t, cfg))
	var sshL net.Listener
	if err := inNS(s.outerPath, func() (err error) { sshL, err = net.Listen("tcp4", ":22"); return err }); err != nil {
		t.Fatal(err)
	}
	defer sshL.Close()
	udpO := listenPacketIn(t, s.outerPath, "udp4", ":5353")
	host := s.HostIP.String()

	tcpProbe := func(port int) error {
		c, err := dialFrom(s.NetNSPath, "tcp4", net.JoinHostPort(host, fmt.Sprint(port)), blocked)
		if err == nil {
			c.Close()
		}
		return err
	}
	for _, port := range []int{22, cfg.DNSPort, cfg.ProxyPort} {
		if err := tcpProbe(port); err == nil {
			t.Errorf("tcp to %s:%d connected", host, port)
		} else {
			t.Logf("tcp to %s:%d: %v", host, port, err)
		}
	}
	if c, err := acceptWithin(sshL, 50*time.Millisecond); err == nil {
		c.Close()
		t.Error("listener on HostIP:22 in O got a connection")
	}
	if c, err := acceptWithin(s.Listener, 50*time.Millisecond); err == nil {
		c.Close()
		t.Error("proxy listener got a connection addressed to HostIP")
	}

	pc := listenPacketIn(t, s.NetNSPath, "udp4", ":0")
	for _, dst := range []string{host + ":5353", net.JoinHostPort(host, fmt.Sprint(cfg.DNSPort)), "192.0.2.1:123"} {
		if _, err := pc.WriteTo([]byte("x"), net.UDPAddrFromAddrPort(netip.MustParseAddrPort(dst))); err != nil {
			t.Fatalf("send udp to %s: %v", dst, err)
		}
	}
	if b, from, err := readWithin(udpO, blocked); err == nil {
		t.Errorf("udp socket in O on :5353 got %q from %s", b, from)
	}
	if b, from, err := readWithin(s.DNS, blocked); err == nil {
		t.Errorf("DNS socket got non-port-53 datagram %q from %s", b, from)
	}

	if ping(t, s.NetNSPath, s.GuestIP) != nil {
		t.Fatal("control: sandbox cannot ping its own address, the ICMP probe is broken")
	}
	if err := ping(t, s.NetNSPath, s.HostIP); err == nil {
		t.Error("ping to HostIP answered")
	}
	if err := ping(t, s.NetNSPath, netip.MustParseAddr("192.0.2.1")); err == nil {
		t.Error("ping to 192.0.2.1 answered")
	}

	// A spoofed source (an extra address the sandbox gives itself) dies
	// in O's reverse-path filter, so the proxy only ever sees GuestIP.
	inner, err := netns.GetFromPath(s.NetNSPath)
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	h, err := netlink.NewHandleAt(inner)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth0, err := h.LinkByName(guestIfName)
	if err != nil {
		t.Fatal(err)
	}
	spoof := &net.UDPAddr{IP: net.IPv4(10, 99, 0, 5)}
	if err := h.AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: spoof.IP, Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	spc := listenPacketIn(t, s.NetNSPath, "udp4", spoof.String())
	if _, err := spc.WriteTo([]byte("spoofed"), net.UDPAddrFromAddrPort(netip.MustParseAddrPort(fakeDNS))); err != nil {
		t.Fatal(err)
	}
	if b, from, err := readWithin(s.DNS, blocked); err == nil {
		t.Errorf("DNS socket got %q from spoofed source %s", b, from)
	}
	var sc net.Conn
	if err := inNS(s.NetNSPath, func() (err error) {
		d := net.Dialer{Timeout: blocked, LocalAddr: &net.TCPAddr{IP: spoof.IP}}
		sc, err = d.Dial("tcp4", fakeHTTP)
		return err
	}); err == nil {
		sc.Close()
		t.Error("tcp from a spoofed source connected")
	}

	for path, want := range map[string]map[string]string{
		s.NetNSPath: {"ipv6/conf/all/disable_ipv6": "1", "ipv6/conf/default/disable_ipv6": "1"},
		s.outerPath: {"ipv6/conf/all/disable_ipv6": "1", "ipv4/ip_forward": "0", "ipv4/conf/all/rp_filter": "1"},
	} {
		for k, v := range want {
			var got []byte
			if err := inNS(path, func() (err error) { got, err = os.ReadFile("/proc/sys/net/" + k); return err }); err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(string(got)) != v {
				t.Errorf("%s: %s = %q, want %s", filepath.Base(path), k, got, v)
			}
		}
	}
	for _, path := range []string{s.NetNSPath, s.outerPath} {
		var v []byte
		var v6 []netlink.Addr
		if err := inNS(path, func() (err error) {
			if v, err = os.ReadFile("/proc/sys/net/ipv6/conf/all/disable_ipv6"); err != nil {
				return err
			}
			v6, err = netlink.AddrList(nil, netlink.FAMILY_V6)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(v)) != "1" || len(v6) != 0 {
			t.Errorf("%s: disable_ipv6=%q, ipv6 addresses %v", filepath.Base(path), v, v6)
		}
	}

	// Control: without the table the same probes get through, so the
	// failures above are the firewall's doing.
	fd, err := netns.GetFromPath(s.outerPath)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(fd)))
	if err != nil {
		t.Fatal(err)
	}
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "cella"})
	if err := c.Flush(); err != nil {
		t.Fatalf("delete table: %v", err)
	}
	if err := tcpProbe(22); err != nil {
		t.Errorf("control: tcp to HostIP:22 without firewall: %v", err)
	}
	if err := ping(t, s.NetNSPath, s.HostIP); err != nil {
		t.Errorf("control: ping HostIP without firewall: %v", err)
	}
}

// ping sends one ICMP echo from the namespace at path and waits for the
// reply for the blocked interval.
func ping(t *testing.T, path string, dst netip.Addr) error {
	t.Helper()
	pc := listenPacketIn(t, path, "ip4:icmp", "0.0.0.0")
	const id, seq = 0xce11, 1
	msg := []byte{8, 0, 0, 0, id >> 8, id & 0xff, 0, seq, 'c', 'e', 'l', 'l', 'a'}
	var sum uint32
	for i := 0; i+1 < len(msg); i += 2 {
		sum += uint32(msg[i])<<8 | uint32(msg[i+1])
	}
	sum += uint32(msg[len(msg)-1]) << 8
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	msg[2], msg[3] = byte(^sum>>8), byte(^sum)
	if _, err := pc.WriteTo(msg, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
		return err
	}
	deadline := time.Now().Add(blocked)
	for {
		b, from, err := readWithin(pc, time.Until(deadline))
		if err != nil {
			return err
		}
		// The raw socket also sees our own request when pinging locally.
		if len(b) >= 8 && b[0] == 0 && b[4] == id>>8 && b[5] == id&0xff && from.String() == dst.String() {
			return nil
		}
	}
}

func TestSlotsIsolated(t *testing.T) {
	needRoot(t)
	m := newManager(t, testConfig(t, 0))
	a, b := acquire(t, m), acquire(t, m)
	if a.GuestIP != b.GuestIP || a.HostIP != b.HostIP || a.NetNSPath == b.NetNSPath {
		t.Fatalf("slots should share addresses but not namespaces: %+v %+v", a, b)
	}
	for _, p := range []struct{ from, other *Slot }{{a, b}, {b, a}} {
		c, err := dialFrom(p.from.NetNSPath, "tcp4", fakeHTTP, 2*time.Second)
		if err != nil {
			t.Fatalf("dial from %s: %v", p.from.ID, err)
		}
		c.Close()
		if ac, err := acceptWithin(p.from.Listener, 2*time.Second); err != nil {
			t.Fatalf("%s's own listener: %v", p.from.ID, err)
		} else {
			ac.Close()
		}
		if ac, err := acceptWithin(p.other.Listener, blocked); err == nil {
			ac.Close()
			t.Errorf("%s's connection reached %s's listener", p.from.ID, p.other.ID)
		}
		pc := listenPacketIn(t, p.from.NetNSPath, "udp4", ":0")
		if _, err := pc.WriteTo([]byte("q"), net.UDPAddrFromAddrPort(netip.MustParseAddrPort(fakeDNS))); err != nil {
			t.Fatal(err)
		}
		if _, _, err := readWithin(p.from.DNS, 2*time.Second); err != nil {
			t.Fatalf("%s's own DNS socket: %v", p.from.ID, err)
		}
		if _, _, err := readWithin(p.other.DNS, blocked); err == nil {
			t.Errorf("%s's DNS query reached %s's DNS socket", p.from.ID, p.other.ID)
		}
	}
	// The other slot's addresses are this slot's own, so there is nothing
	// else to aim at: HostIP:any is dropped (TestBlocked) and GuestIP is
	// the sandbox itself.
}

type rootState struct{ links, addrs, sysctls []string }

func snapshotRoot(t *testing.T) rootState {
	t.Helper()
	ls, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	as, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var st rootState
	for _, l := range ls {
		st.links = append(st.links, fmt.Sprintf("%d:%s", l.Attrs().Index, l.Attrs().Name))
	}
	for _, a := range as {
		st.addrs = append(st.addrs, fmt.Sprintf("%d:%s", a.LinkIndex, a.IPNet))
	}
	sort.Strings(st.links)
	sort.Strings(st.addrs)
	// Slots write these in their own namespaces; a write that landed in
	// the root namespace would switch the host's IPv6 off.
	for _, k := range []string{"all", "default"} {
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + k + "/disable_ipv6")
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		st.sysctls = append(st.sysctls, k+"="+strings.TrimSpace(string(b)))
	}
	return st
}

// checkThreadsHome fails if any thread of this process is not in the main
// thread's network namespace: a thread left in a slot namespace would put
// unrelated goroutines' sockets there.
func checkThreadsHome(t *testing.T) {
	t.Helper()
	home, err := os.Readlink(fmt.Sprintf("/proc/self/task/%d/ns/net", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		ns, err := os.Readlink("/proc/self/task/" + task.Name() + "/ns/net")
		if err == nil && ns != home {
			t.Errorf("thread %s is in %s, not %s", task.Name(), ns, home)
		}
	}
}

func TestRootNetNSUntouched(t *testing.T) {
	needRoot(t)
	before := snapshotRoot(t)
	cfg := testConfig(t, 2)
	m, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var slots []*Slot
	for range 3 {
		s, err := m.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, s)
	}
	during := snapshotRoot(t)
	for _, s := range slots {
		if err := s.Release(); err != nil {
			t.Error(err)
		}
	}
	if err := m.Close(); err != nil {
		t.Error(err)
	}
	after := snapshotRoot(t)
	for name, st := range map[string]rootState{"with slots": during, "after release": after} {
		if !slices.Equal(before.links, st.links) || !slices.Equal(before.addrs, st.addrs) || !slices.Equal(before.sysctls, st.sysctls) {
			t.Errorf("root netns changed %s:\nlinks %v -> %v\naddrs %v -> %v\nsysctls %v -> %v",
				name, before.links, st.links, before.addrs, st.addrs, before.sysctls, st.sysctls)
		}
	}
	checkThreadsHome(t)
}

func TestReleaseCleansUp(t *testing.T) {
	needRoot(t)
	cfg := testConfig(t, 0)
	m := newManager(t, cfg)
	s, err := m.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	files := []string{s.NetNSPath, s.outerPath}
	if got := mountsUnder(t, cfg.RunDir); !slices.Equal(got, files) && !slices.Equal(got, []string{files[1], files[0]}) {
		t.Fatalf("mounts under run dir = %v, want %v", got, files)
	}
	// Holding S open keeps it alive after Release; O is not held by
	// anything, so its death (which takes the veth, and so S's eth0, with
	// it) shows that Release left no reference to O behind.
	inner, err := netns.GetFromPath(s.NetNSPath)
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	h, err := netlink.NewHandleAt(inner)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.LinkByName(guestIfName); err != nil {
		t.Fatalf("no eth0 in S before release: %v", err)
	}

	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	for _, f := range files {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists: %v", f, err)
		}
	}
	if got := mountsUnder(t, cfg.RunDir); len(got) != 0 {
		t.Errorf("mounts left: %v", got)
	}
	if _, err := s.Listener.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Release = %v", err)
	}
	start := time.Now()
	for {
		if _, err := h.LinkByName(guestIfName); err != nil {
			t.Logf("outer namespace gone %v after Release (eth0 lookup: %v)", time.Since(start), err)
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatal("eth0 still in S 10s after Release: something keeps O alive")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestReap(t *testing.T) {
	needRoot(t)
	cfg := testConfig(t, 0)
	m, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Reap(cfg.RunDir); err == nil {
		t.Error("Reap succeeded while a Manager owns the run dir")
	}
	// A crash: the daemon's sockets die with it, the mounts stay.
	s.Listener.Close()
	s.DNS.Close()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if got := nsFilesIn(t, cfg.RunDir); len(got) != 2 {
		t.Fatalf("before reap: %v", got)
	}
	n, err := Reap(cfg.RunDir)
	if err != nil || n != 2 {
		t.Fatalf("Reap = %d, %v; want 2", n, err)
	}
	if got := nsFilesIn(t, cfg.RunDir); len(got) != 0 {
		t.Errorf("files left after reap: %v", got)
	}
	if got := mountsUnder(t, cfg.RunDir); len(got) != 0 {
		t.Errorf("mounts left after reap: %v", got)
	}

	// New reaps by itself.
	m2, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := m2.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s2.Listener.Close()
	s2.DNS.Close()
	m2.Close()
	newManager(t, cfg)
	if got := nsFilesIn(t, cfg.RunDir); len(got) != 0 {
		t.Errorf("New did not reap: %v", got)
	}
	if err := s.Release(); err != nil { // after a reap there is nothing left to do
		t.Errorf("Release after Reap: %v", err)
	}
}

// TestAdopt: after a crash, a slot a sandbox still runs in is kept by the
// next manager and adopted: traffic from its namespace reaches the new
// sockets again. The slot nobody adopts is removed by ReapUnadopted.
func TestAdopt(t *testing.T) {
	needRoot(t)
	cfg := testConfig(t, 0)
	m, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var crashed []*Slot
	for range 2 {
		s, err := m.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		s.Listener.Close() // the daemon's sockets die with it
		s.DNS.Close()
		crashed = append(crashed, s)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	kept, orphan := crashed[0], crashed[1]

	cfg.Adoptable = []string{kept.ID, orphan.ID, "n000000000000", "../../etc"}
	m2 := newManager(t, cfg)
	if got := nsFilesIn(t, cfg.RunDir); len(got) != 4 {
		t.Fatalf("New with two adoptable slots left %v, want their four files", got)
	}
	if _, err := m2.Adopt("n000000000000"); err == nil {
		t.Fatal("adopted a slot that does not exist")
	}
	s, err := m2.Adopt(kept.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Release() })
	if _, err := m2.Adopt(kept.ID); err == nil {
		t.Fatal("adopted the same slot twice")
	}
	if s.NetNSPath != kept.NetNSPath {
		t.Fatalf("adopted slot namespace %s, want %s", s.NetNSPath, kept.NetNSPath)
	}
	c, err := dialFrom(s.NetNSPath, "tcp4", fakeHTTP, 2*time.Second)
	if err != nil {
		t.Fatalf("dial from the adopted slot: %v", err)
	}
	defer c.Close()
	ac, err := acceptWithin(s.Listener, 2*time.Second)
	if err != nil {
		t.Fatalf("the adopted slot's listener gets nothing: %v", err)
	}
	defer ac.Close()
	if od, err := OriginalDst(ac); err != nil || od != netip.MustParseAddrPort(fakeHTTP) {
		t.Fatalf("OriginalDst = %v, %v; want %s", od, err, fakeHTTP)
	}

	n, err := m2.ReapUnadopted()
	if err != nil || n != 2 {
		t.Fatalf("ReapUnadopted = %d, %v; want the orphan's 2 files", n, err)
	}
	if got := nsFilesIn(t, cfg.RunDir); len(got) != 2 {
		t.Fatalf("after ReapUnadopted: %v, want only the adopted slot's files", got)
	}
	if _, err := m2.Adopt(orphan.ID); err == nil {
		t.Fatal("adopted a reaped slot")
	}
	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
	if got := nsFilesIn(t, cfg.RunDir); len(got) != 0 {
		t.Fatalf("after releasing the adopted slot: %v", got)
	}
}

func TestPool(t *testing.T) {
	needRoot(t)
	cfg := testConfig(t, 3)
	m := newManager(t, cfg)
	deadline := time.Now().Add(10 * time.Second)
	for {
		m.mu.Lock()
		n := len(m.pool)
		m.mu.Unlock()
		if n == cfg.PoolSize {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool has %d slots after 10s", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	s := acquire(t, m)
	t.Logf("Acquire from a full pool took %v (slot setup took %v)", time.Since(start), s.SetupTime())
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	got := nsFilesIn(t, cfg.RunDir)
	want := []string{s.ID + "-o", s.ID + "-s"}
	if !slices.Equal(got, want) {
		t.Errorf("after Close, run dir holds %v, want only the acquired slot %v", got, want)
	}
	if _, err := m.Acquire(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Acquire after Close = %v, want ErrClosed", err)
	}
	// The acquired slot still works after Close.
	c, err := dialFrom(s.NetNSPath, "tcp4", fakeHTTP, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

func TestAcquireConcurrent(t *testing.T) {
	needRoot(t)
	cfg := testConfig(t, 1)
	m := newManager(t, cfg)
	const n = 8
	slots := make([]*Slot, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { slots[i], errs[i] = m.Acquire(context.Background()) })
	}
	wg.Wait()
	ids := map[string]bool{}
	for i, s := range slots {
		if errs[i] != nil {
			t.Fatalf("Acquire %d: %v", i, errs[i])
		}
		t.Cleanup(func() { _ = s.Release() })
		if ids[s.ID] {
			t.Fatalf("slot %s handed out twice", s.ID)
		}
		ids[s.ID] = true
	}
	// Close first: the refill goroutine may be inside a new namespace on
	// its locked thread right now, which is fine while it is locked.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	checkThreadsHome(t)
}

func TestAcquireCanceled(t *testing.T) {
	needRoot(t)
	m := newManager(t, testConfig(t, 0))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire with canceled context = %v", err)
	}
}

func TestSetupTime(t *testing.T) {
	needRoot(t)
	cfg := testConfig(t, 0)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var ds []time.Duration
	for i := range 20 {
		s, err := makeSlot(&cfg, fmt.Sprintf("t%02d", i))
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, s.SetupTime())
		if err := s.Release(); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(ds)
	t.Logf("slot setup over %d runs: min %v, median %v, max %v", len(ds), ds[0], ds[len(ds)/2], ds[len(ds)-1])
}

func BenchmarkMakeSlot(b *testing.B) {
	needRoot(b)
	cfg := testConfig(b, 0)
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	for i := 0; b.Loop(); i++ {
		s, err := makeSlot(&cfg, fmt.Sprintf("b%d", i))
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Release(); err != nil {
			b.Fatal(err)
		}
	}
}

func TestOriginalDstRejectsNonTCP(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if _, err := OriginalDst(a); err == nil {
		t.Error("OriginalDst of a pipe succeeded")
	}
	u, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := OriginalDst(u.(*net.UDPConn)); err == nil {
		t.Error("OriginalDst of a UDP socket succeeded")
	}
}

func TestConfigValidate(t *testing.T) {
	var zero Config
	if err := zero.Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
	if zero.Prefix != DefaultPrefix || zero.RunDir != DefaultRunDir || zero.ProxyPort != DefaultProxyPort || zero.DNSPort != DefaultDNSPort || zero.PoolSize != 0 {
		t.Errorf("defaults not filled: %+v", zero)
	}
	if zero.HostIP().String() != "10.200.0.1" || zero.guestIP().String() != "10.200.0.2" {
		t.Errorf("addresses %s %s", zero.HostIP(), zero.guestIP())
	}
	wide := Config{Prefix: netip.MustParsePrefix("172.30.5.7/24")}
	if err := wide.Validate(); err != nil || wide.HostIP().String() != "172.30.5.1" || wide.guestIP().String() != "172.30.5.2" {
		t.Errorf("/24: %v %s %s", err, wide.HostIP(), wide.guestIP())
	}
	for name, c := range map[string]Config{
		"ipv6":      {Prefix: netip.MustParsePrefix("fd00::/64")},
		"4in6":      {Prefix: netip.MustParsePrefix("::ffff:10.0.0.0/126")},
		"/31":       {Prefix: netip.MustParsePrefix("10.0.0.0/31")},
		"relative":  {RunDir: "run/net"},
		"pool":      {PoolSize: -1},
		"port":      {ProxyPort: 70000},
		"same port": {ProxyPort: 5000, DNSPort: 5000},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted %+v", name, c)
		}
	}
}

// TestMakeSlotFailureCleansUp fails slot creation halfway (S's file is
// taken) and checks that O's file, mount and sockets are gone, the
// foreign file is left alone and no thread stays behind in a namespace.
func TestMakeSlotFailureCleansUp(t *testing.T) {
	needRoot(t)
	cfg := testConfig(t, 0)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	taken := filepath.Join(cfg.RunDir, "fail-s")
	if err := os.WriteFile(taken, []byte("not ours"), 0o644); err != nil {
		t.Fatal(err)
	}
	fds := func() int {
		es, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(es)
	}
	before := fds()
	if s, err := makeSlot(&cfg, "fail"); err == nil {
		s.Release()
		t.Fatal("makeSlot succeeded over an existing file")
	} else {
		t.Logf("makeSlot: %v", err)
	}
	if got := nsFilesIn(t, cfg.RunDir); !slices.Equal(got, []string{"fail-s"}) {
		t.Errorf("run dir holds %v, want only the foreign file", got)
	}
	if got := mountsUnder(t, cfg.RunDir); len(got) != 0 {
		t.Errorf("mounts left: %v", got)
	}
	if after := fds(); after != before {
		t.Errorf("%d file descriptors before, %d after: sockets or handles leaked", before, after)
	}
	checkThreadsHome(t)

	cfg.RunDir = filepath.Join(cfg.RunDir, "missing")
	if _, err := makeSlot(&cfg, "x"); err == nil {
		t.Fatal("makeSlot succeeded in a missing directory")
	}
	checkThreadsHome(t)
}
