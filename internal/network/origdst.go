package network

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// OriginalDst returns where a connection accepted on Slot.Listener was
// headed before O's redirect rewrote it, read from conntrack with
// SO_ORIGINAL_DST. c must be a TCP connection (usually *net.TCPConn).
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("original destination: %T has no socket", c)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	var (
		mreq *unix.IPv6Mreq
		gerr error
	)
	// The option fills a struct sockaddr_in; IPv6Mreq is the one x/sys
	// getter with a buffer at least that large (the kernel only checks the
	// buffer is big enough), so it avoids unsafe here.
	cerr := rc.Control(func(fd uintptr) {
		mreq, gerr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
	})
	if cerr != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", cerr)
	}
	if gerr != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: getsockopt SO_ORIGINAL_DST: %w", gerr)
	}
	sa := mreq.Multiaddr // sockaddr_in: family (host order), port, addr (network order)
	if fam := binary.NativeEndian.Uint16(sa[0:2]); fam != unix.AF_INET {
		return netip.AddrPort{}, fmt.Errorf("original destination: address family %d, want AF_INET", fam)
	}
	port := binary.BigEndian.Uint16(sa[2:4])
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(sa[4:8])), port), nil
}
