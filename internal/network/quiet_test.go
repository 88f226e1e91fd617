package network

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestQuiet: a connection is quiet until its peer sends a byte or closes,
// and a peek leaves the byte to be read.
func TestQuiet(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := func() (client, server net.Conn) {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return c, s
	}
	// until reports whether c stops being quiet within a minute.
	until := func(c net.Conn) bool {
		deadline := time.Now().Add(time.Minute)
		for Quiet(c) {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(time.Millisecond)
		}
		return true
	}

	c, s := peer()
	defer c.Close()
	if !Quiet(c) {
		t.Fatal("a connection nobody wrote to is not quiet")
	}
	s.Write([]byte("x"))
	if !until(c) {
		t.Fatal("still quiet after its peer sent a byte")
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil || b[0] != 'x' {
		t.Fatalf("the byte after the peek: %q %v", b, err)
	}
	if !Quiet(c) {
		t.Error("not quiet once the byte was read")
	}
	s.Close()
	if !until(c) {
		t.Error("still quiet after its peer closed")
	}

	if Quiet(struct{ net.Conn }{c}) {
		t.Error("a connection without a socket is quiet")
	}
}
