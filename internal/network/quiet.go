package network

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// Quiet reports whether nothing waits to be read on c — no bytes, no end
// of stream — without blocking or consuming anything (a peek that does not
// wait). A connection kept idle for reuse that is not quiet was closed by
// its peer or sent what nobody asked for. False when c has no socket.
func Quiet(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	quiet := false
	var b [1]byte
	if err := rc.Control(func(fd uintptr) {
		_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		quiet = errors.Is(err, unix.EAGAIN)
	}); err != nil {
		return false
	}
	return quiet
}
