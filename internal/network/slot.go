package network

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	hostIfName  = "cella0"
	guestIfName = "eth0"
)

// The veth MACs are the same in every slot for the same reason as the
// addresses: a restored gVisor checkpoint still has HostIP's neighbour
// entry, and a different cella0 MAC would make O discard its frames.
var (
	hostMAC  = net.HardwareAddr{0x02, 0xce, 0x11, 0xa0, 0x00, 0x01}
	guestMAC = net.HardwareAddr{0x02, 0xce, 0x11, 0xa0, 0x00, 0x02}
)

// Slot is one sandbox's network: the namespace to run it in and the
// daemon-side sockets that receive everything it sends. A slot is used by
// one sandbox at most, then released.
type Slot struct {
	ID string
	// NetNSPath is S, the namespace for the OCI spec's network namespace.
	NetNSPath string
	// GuestIP is eth0's address in S; HostIP is cella0's in O and S's
	// default gateway.
	GuestIP, HostIP netip.Addr
	// Listener receives every TCP connection the sandbox opens, whatever
	// its destination; OriginalDst tells where it was headed. The peer is
	// always GuestIP: O's reverse-path filter drops other sources.
	Listener net.Listener
	// DNS receives every UDP datagram the sandbox sends to port 53. Replies
	// written back with WriteTo reach the sandbox as if from the address it
	// queried, because conntrack undoes the redirect.
	DNS net.PacketConn

	outerPath string
	setup     time.Duration

	mu sync.Mutex
	// nsFiles are the bind-mounted namespace files not yet removed.
	nsFiles  []string
	released bool
}

// SetupTime is how long making the slot took, for logs.
func (s *Slot) SetupTime() time.Duration { return s.setup }

// Release closes the slot's sockets and removes its namespace files. Once
// nothing else (a sandbox still shutting down) holds them, the kernel
// destroys both namespaces and the veth pair with them. Calling it again
// only retries files that could not be removed.
func (s *Slot) Release() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if !s.released {
		s.released = true
		if s.Listener != nil {
			if err := s.Listener.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, fmt.Errorf("close listener: %w", err))
			}
		}
		if s.DNS != nil {
			if err := s.DNS.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, fmt.Errorf("close dns socket: %w", err))
			}
		}
	}
	var left []string
	for _, p := range s.nsFiles {
		if err := removeNSFile(p); err != nil {
			errs = append(errs, err)
			left = append(left, p)
		}
	}
	s.nsFiles = left
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("release network slot %s: %w", s.ID, err)
	}
	return nil
}

// removeNSFile unmounts and deletes a namespace file. MNT_DETACH because a
// runtime may still have it open; the namespace outlives the file anyway.
func removeNSFile(p string) error {
	// A file can carry several stacked mounts (a crash between two
	// attempts); unmount until the kernel says there is none left.
	for range 16 {
		err := unix.Unmount(p, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", p, err)
		}
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// buildState holds what making a slot needs only until the slot is wired.
type buildState struct {
	outer, inner     netns.NsHandle
	outerNL, innerNL *netlink.Handle
}

func newBuildState() *buildState { return &buildState{outer: netns.None(), inner: netns.None()} }

func (st *buildState) close() {
	for _, h := range []*netlink.Handle{st.outerNL, st.innerNL} {
		if h != nil {
			h.Close()
		}
	}
	for _, ns := range []netns.NsHandle{st.outer, st.inner} {
		if ns.IsOpen() {
			_ = ns.Close()
		}
	}
}

// A slot's two namespace files in the run dir: <id>-s (the sandbox's, S)
// and <id>-o (the outer one, O).
const (
	innerSuffix = "-s"
	outerSuffix = "-o"
)

func nsPaths(runDir, id string) (inner, outer string) {
	return filepath.Join(runDir, id+innerSuffix), filepath.Join(runDir, id+outerSuffix)
}

// newSlot is slot id's value before its namespaces are made or opened.
func newSlot(cfg *Config, id string) *Slot {
	s := &Slot{ID: id, GuestIP: cfg.guestIP(), HostIP: cfg.HostIP()}
	s.NetNSPath, s.outerPath = nsPaths(cfg.RunDir, id)
	return s
}

// makeSlot creates, wires and firewalls a new slot with the given id.
func makeSlot(cfg *Config, id string) (*Slot, error) {
	start := time.Now()
	s := newSlot(cfg, id)
	st := newBuildState()
	defer st.close()
	err := createNamespaces(cfg, s, st)
	if err == nil {
		err = wire(cfg, s, st)
	}
	if err == nil {
		err = installRules(int(st.outer), s.HostIP, cfg.ProxyPort, cfg.DNSPort)
	}
	if err != nil {
		if rerr := s.Release(); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, fmt.Errorf("make network slot %s: %w", id, err)
	}
	s.setup = time.Since(start)
	return s, nil
}

// createNamespaces does everything that needs a thread inside the new
// namespaces, on a dedicated locked thread: unshare and setns change only
// the calling thread, and any goroutine later scheduled on a thread left in
// a slot namespace would silently open its sockets there.
func createNamespaces(cfg *Config, s *Slot, st *buildState) error {
	return onLockedThread(func() error { return createInside(cfg, s, st) })
}

// onLockedThread runs fn, which may move its thread to other network
// namespaces, on a locked thread of its own, and returns the thread to
// where it was afterwards.
func onLockedThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open current network namespace: %w", err)
			return
		}
		defer orig.Close()
		err = fn()
		if rerr := netns.Set(orig); rerr != nil {
			// Staying locked makes the runtime end this thread when the
			// goroutine returns, instead of reusing it in the wrong netns.
			errc <- errors.Join(err, fmt.Errorf("return to original network namespace: %w", rerr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// createInside runs on the locked thread; it leaves the thread in S.
func createInside(cfg *Config, s *Slot, st *buildState) error {
	var err error
	if st.outer, err = s.newNamespace(s.outerPath, outerSysctls); err != nil {
		return fmt.Errorf("outer namespace: %w", err)
	}
	// Netlink handles made here are bound to O for good, which spares
	// netlink.NewHandleAt's own setns round trip (and its habit of
	// unlocking the thread even when switching back failed).
	if st.outerNL, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return fmt.Errorf("netlink handle in outer namespace: %w", err)
	}
	if err := listenInside(cfg, s); err != nil {
		return err
	}
	if st.inner, err = s.newNamespace(s.NetNSPath, innerSysctls); err != nil {
		return fmt.Errorf("sandbox namespace: %w", err)
	}
	if st.innerNL, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return fmt.Errorf("netlink handle in sandbox namespace: %w", err)
	}
	return nil
}

// listenInside opens the slot's sockets in the calling thread's network
// namespace. Sockets belong to the namespace they were created in, so they
// keep receiving O's traffic after the thread leaves.
func listenInside(cfg *Config, s *Slot) error {
	// (Assigned through locals: a nil *TCPListener in the interface field
	// would look like an open listener to Release.)
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{Port: cfg.ProxyPort})
	if err != nil {
		return fmt.Errorf("listen for sandbox tcp: %w", err)
	}
	s.Listener = ln
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{Port: cfg.DNSPort})
	if err != nil {
		return fmt.Errorf("listen for sandbox dns: %w", err)
	}
	s.DNS = pc
	return nil
}

// sysctl is a setting written inside a new namespace, while the creating
// thread is in it: /proc/sys/net resolves against the calling thread's
// network namespace.
type sysctl struct {
	path, value string
	optional    bool // absent when the kernel runs without IPv6
}

// IPv6 is disabled before any interface exists, so neither lo nor the veth
// ever gets an IPv6 address, and S sends no router solicitations or DAD
// probes before gVisor takes eth0 over. A new namespace starts with the
// compiled-in IPv6 defaults, so this is always needed.
var noIPv6 = []sysctl{
	{"/proc/sys/net/ipv6/conf/all/disable_ipv6", "1", true},
	{"/proc/sys/net/ipv6/conf/default/disable_ipv6", "1", true},
}

var innerSysctls = noIPv6

// A new namespace copies the root namespace's IPv4 settings (unless
// net.core.devconf_inherit_init_net says otherwise), so on a host with
// forwarding on, O would start with it on too; switch it off explicitly.
// Strict reverse-path filtering drops packets whose source is not GuestIP
// (O has no route to anything else), so the proxy only ever sees GuestIP as
// the peer.
var outerSysctls = append([]sysctl{
	{"/proc/sys/net/ipv4/ip_forward", "0", false},
	{"/proc/sys/net/ipv4/conf/all/rp_filter", "1", false},
	{"/proc/sys/net/ipv4/conf/default/rp_filter", "1", false},
}, noIPv6...)

// newNamespace moves the calling (locked) thread into a new network
// namespace, pins it with a bind mount on path and returns a handle to it.
func (s *Slot) newNamespace(path string, sysctls []sysctl) (netns.NsHandle, error) {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return netns.None(), fmt.Errorf("unshare: %w", err)
	}
	ns, err := netns.Get()
	if err != nil {
		return netns.None(), fmt.Errorf("open new namespace: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		_ = ns.Close()
		return netns.None(), fmt.Errorf("create namespace file: %w", err)
	}
	_ = f.Close()
	s.mu.Lock()
	s.nsFiles = append(s.nsFiles, path)
	s.mu.Unlock()
	src := "/proc/self/task/" + strconv.Itoa(unix.Gettid()) + "/ns/net"
	if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
		_ = ns.Close()
		return netns.None(), fmt.Errorf("bind mount namespace on %s: %w", path, err)
	}
	for _, sc := range sysctls {
		if err := os.WriteFile(sc.path, []byte(sc.value), 0); err != nil && !(sc.optional && errors.Is(err, fs.ErrNotExist)) {
			_ = ns.Close()
			return netns.None(), fmt.Errorf("sysctl %s: %w", sc.path, err)
		}
	}
	return ns, nil
}

// wire creates the veth pair across the two namespaces and configures
// addresses and routes through the netlink handles, from any thread.
func wire(cfg *Config, s *Slot, st *buildState) error {
	la := netlink.NewLinkAttrs()
	la.Name = hostIfName
	la.HardwareAddr = hostMAC
	veth := &netlink.Veth{
		LinkAttrs:        la,
		PeerName:         guestIfName,
		PeerHardwareAddr: guestMAC,
		// The guest end is born in S, so it never appears anywhere else.
		PeerNamespace: netlink.NsFd(int(st.inner)),
	}
	if err := st.outerNL.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth pair: %w", err)
	}
	bits := cfg.Prefix.Bits()
	// cella0 comes up first: S's default route needs its gateway on a
	// link that has carrier.
	if _, err := linkUp(st.outerNL, hostIfName, s.HostIP, bits); err != nil {
		return fmt.Errorf("outer namespace: %w", err)
	}
	if _, err := linkUp(st.outerNL, "lo", netip.Addr{}, 0); err != nil {
		return fmt.Errorf("outer namespace: %w", err)
	}
	guest, err := linkUp(st.innerNL, guestIfName, s.GuestIP, bits)
	if err != nil {
		return fmt.Errorf("sandbox namespace: %w", err)
	}
	if _, err := linkUp(st.innerNL, "lo", netip.Addr{}, 0); err != nil {
		return fmt.Errorf("sandbox namespace: %w", err)
	}
	def := &netlink.Route{LinkIndex: guest.Attrs().Index, Gw: s.HostIP.AsSlice()}
	if err := st.innerNL.RouteAdd(def); err != nil {
		return fmt.Errorf("sandbox namespace: default route via %s: %w", s.HostIP, err)
	}
	return nil
}

// linkUp gives link name the address a/bits (if valid) and sets it up.
func linkUp(h *netlink.Handle, name string, a netip.Addr, bits int) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", name, err)
	}
	if a.IsValid() {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}}
		if err := h.AddrAdd(l, addr); err != nil {
			return nil, fmt.Errorf("add %s/%d to %s: %w", a, bits, name, err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("set %s up: %w", name, err)
	}
	return l, nil
}

// slotIDRE is what newID makes.
var slotIDRE = regexp.MustCompile(`^n[0-9a-f]{12}$`)

// adoptSlot opens the sockets of an existing slot again, inside its outer
// namespace.
func adoptSlot(cfg *Config, id string) (*Slot, error) {
	s := newSlot(cfg, id)
	s.nsFiles = []string{s.outerPath, s.NetNSPath}
	start := time.Now()
	outer, err := netns.GetFromPath(s.outerPath)
	if err != nil {
		return nil, fmt.Errorf("adopt network slot %s: open outer namespace: %w", id, err)
	}
	defer outer.Close()
	err = onLockedThread(func() error {
		if err := netns.Set(outer); err != nil {
			return fmt.Errorf("enter outer namespace: %w", err)
		}
		return listenInside(cfg, s)
	})
	if err != nil {
		s.mu.Lock()
		s.nsFiles = nil // the files stay for ReapUnadopted; only the sockets go
		s.mu.Unlock()
		_ = s.Release()
		return nil, fmt.Errorf("adopt network slot %s: %w", id, err)
	}
	s.setup = time.Since(start)
	return s, nil
}
