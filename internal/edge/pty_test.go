package edge

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/coder/websocket"
)

// TestRing: the ring keeps the last len(buf) bytes of the stream, whatever
// the sizes of the writes, and since(off) returns exactly the retained
// bytes after stream offset off.
func TestRing(t *testing.T) {
	const size = 16
	r := ring{buf: make([]byte, size)}
	var stream []byte
	for i, n := range []int{3, 0, 5, 7, 1, 15, 2, 9, 11} {
		p := bytes.Repeat([]byte{byte('a' + i)}, n)
		for j := range p {
			p[j] += byte(j % 3) // not one repeated byte: order shows
		}
		r.write(p)
		stream = append(stream, p...)
		if r.total != int64(len(stream)) {
			t.Fatalf("write %d: total %d, want %d", i, r.total, len(stream))
		}
		kept := max(0, len(stream)-size)
		for off := int64(0); off <= int64(len(stream))+2; off++ {
			var want []byte
			if start := max(int(off), kept); start < len(stream) {
				want = stream[start:]
			}
			if got := r.since(off); !bytes.Equal(got, want) {
				t.Fatalf("write %d, since(%d) = %q, want %q (stream %q)", i, off, got, want, stream)
			}
		}
	}
}

// TestAttach: a client that joins gets the session message (with the
// offset its replay starts at) and the replay before any new output, none
// of it twice or lost; one whose queue overflows is dropped, its channel
// closed, and can join again from its offset.
func TestAttach(t *testing.T) {
	ss := &Shell{id: "s1", pid: 42, table: &Shells{}, cancel: func() {}, ring: ring{buf: make([]byte, 8)}, clients: map[*ptyClient]struct{}{}}
	ss.output([]byte("01234"))
	ss.output([]byte("56789")) // the ring keeps 23456789
	c, ok := ss.attach(5)
	if !ok {
		t.Fatal("attach refused")
	}
	ss.output([]byte("AB"))
	var hello struct {
		Type           string
		Session        string
		Pid            int
		Offset, Replay int64
	}
	m := <-c.out
	if m.typ != websocket.MessageText || json.Unmarshal(m.data, &hello) != nil ||
		hello.Type != "session" || hello.Session != "s1" || hello.Pid != 42 || hello.Offset != 5 || hello.Replay != 5 {
		t.Fatalf("session message %s", m.data)
	}
	if m := <-c.out; string(m.data) != "56789" {
		t.Fatalf("replay %q", m.data)
	}
	if m := <-c.out; string(m.data) != "AB" {
		t.Fatalf("output after the replay %q", m.data)
	}
	// An offset older than the ring replays what it kept.
	c2, _ := ss.attach(0)
	<-c2.out
	if m := <-c2.out; string(m.data) != "456789AB" {
		t.Fatalf("replay from 0: %q", m.data)
	}
	ss.detach(c2)
	// A client that does not read is dropped once its queue is full.
	for range cap(c.out) + 1 {
		ss.output([]byte("x"))
	}
	n := 0
	for range c.out {
		n++
	}
	if !c.dropped || n != cap(c.out) {
		t.Fatalf("slow client: dropped %v after %d frames", c.dropped, n)
	}
	ss.finish(0, "exit status 0")
	if _, ok := ss.attach(0); ok {
		t.Fatal("attached to a shell that ended")
	}
}
