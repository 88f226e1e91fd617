package archive_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/archive"
	"github.com/cella-sandbox/cella/internal/archive/s3test"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

func key(t *testing.T) []byte {
	k := make([]byte, archive.KeySize)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

func seal(t *testing.T, k []byte, name string, plain []byte) []byte {
	var buf bytes.Buffer
	w, err := archive.Seal(&buf, k, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(plain); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func open(k []byte, name string, sealed []byte) ([]byte, error) {
	r, err := archive.Open(bytes.NewReader(sealed), k, name)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}

// TestSealRoundTrip: what Seal writes opens to the same bytes at every
// size around the chunk boundaries, and holds no plaintext.
func TestSealRoundTrip(t *testing.T) {
	k := key(t)
	for _, n := range []int{0, 1, 64<<10 - 1, 64 << 10, 64<<10 + 1, 3 * 64 << 10, 1<<20 + 17} {
		plain := bytes.Repeat([]byte("secret-value!"), n/13+1)[:n]
		sealed := seal(t, k, "sandboxes/a/state", plain)
		if n >= 13 && bytes.Contains(sealed, []byte("secret-value!")) {
			t.Fatalf("%d bytes: the sealed stream holds the plaintext", n)
		}
		got, err := open(k, "sandboxes/a/state", sealed)
		if err != nil || !bytes.Equal(got, plain) {
			t.Fatalf("%d bytes: open = %d bytes, %v", n, len(got), err)
		}
	}
}

// TestSealRefuses: a flipped bit, a cut at or inside any chunk, an
// appended chunk, another object's name or another key never open.
func TestSealRefuses(t *testing.T) {
	k := key(t)
	plain := make([]byte, 3*64<<10+100)
	_, _ = rand.Read(plain)
	sealed := seal(t, k, "sandboxes/a/state", plain)
	chunk := 64<<10 + 16
	hdr := 8 + 16
	cases := map[string]struct {
		name string
		key  []byte
		data []byte
	}{
		"bit flipped":         {"sandboxes/a/state", k, flip(sealed, hdr+chunk+5)},
		"header flipped":      {"sandboxes/a/state", k, flip(sealed, 9)},
		"cut after a chunk":   {"sandboxes/a/state", k, sealed[:hdr+2*chunk]},
		"cut inside a chunk":  {"sandboxes/a/state", k, sealed[:hdr+chunk+100]},
		"cut to the header":   {"sandboxes/a/state", k, sealed[:hdr]},
		"chunk appended":      {"sandboxes/a/state", k, append(append([]byte(nil), sealed...), sealed[hdr:hdr+chunk]...)},
		"chunks swapped":      {"sandboxes/a/state", k, swap(sealed, hdr, chunk)},
		"another sandbox":     {"sandboxes/b/state", k, sealed},
		"another object kind": {"sandboxes/a/manifest", k, sealed},
		"another key":         {"sandboxes/a/state", key(t), sealed},
	}
	for name, c := range cases {
		got, err := open(c.key, c.name, c.data)
		if !errors.Is(err, archive.ErrCorrupt) {
			t.Errorf("%s: open = %d bytes, %v; want ErrCorrupt", name, len(got), err)
		}
	}
}

func flip(b []byte, i int) []byte {
	c := append([]byte(nil), b...)
	c[i] ^= 1
	return c
}

func swap(b []byte, hdr, chunk int) []byte {
	c := append([]byte(nil), b...)
	copy(c[hdr:hdr+chunk], b[hdr+chunk:hdr+2*chunk])
	copy(c[hdr+chunk:hdr+2*chunk], b[hdr:hdr+chunk])
	return c
}

// TestS3Archive: against a real S3 server (versitygw), a state larger
// than several multipart parts goes up sealed and streams back with its
// digest checked; a manifest round-trips; a wrong digest, an object
// replaced by another sandbox's and a cut object are refused; Delete
// leaves the bucket empty.
func TestS3Archive(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := archive.NewS3(ctx, archive.S3Config{URL: srv.URL("cluster-a"), Endpoint: srv.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	a, err := archive.New(b, key(t))
	if err != nil {
		t.Fatal(err)
	}
	state := make([]byte, 20<<20+12345) // 3 parts of 8 MiB
	_, _ = rand.Read(state)
	d, err := a.PutState(ctx, "sbxa", func(w io.Writer) error { _, err := w.Write(state); return err })
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(state)
	if d.SHA256 != hex.EncodeToString(sum[:]) || d.Size != int64(len(state)) {
		t.Fatalf("digest %+v, want the state's", d)
	}
	if err := a.PutManifest(ctx, archive.Manifest{SandboxID: "sbxa", Team: "t1", State: d}); err != nil {
		t.Fatal(err)
	}
	for _, k := range srv.Keys(t) {
		if !strings.HasPrefix(k, "cluster-a/sandboxes/sbxa/") {
			t.Fatalf("object %q outside the prefix", k)
		}
	}
	raw := srv.Object(t, "cluster-a/sandboxes/sbxa/state")
	if bytes.Contains(raw, state[:64]) {
		t.Fatal("the stored state holds plaintext")
	}

	m, err := a.Manifest(ctx, "sbxa")
	if err != nil || m.Team != "t1" || m.State != d {
		t.Fatalf("manifest = %+v, %v", m, err)
	}
	var got bytes.Buffer
	if err := a.OpenState(ctx, "sbxa", m.State, func(r io.Reader) error { _, err := io.Copy(&got, r); return err }); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), state) {
		t.Fatal("the state read back differs")
	}

	// A digest that is not the state's.
	bad := d
	bad.SHA256 = strings.Repeat("0", 64)
	if err := a.OpenState(ctx, "sbxa", bad, func(r io.Reader) error { _, err := io.Copy(io.Discard, r); return err }); !errors.Is(err, archive.ErrCorrupt) {
		t.Fatalf("wrong digest: %v, want ErrCorrupt", err)
	}
	// Another sandbox's manifest copied under this one's name: sealed for
	// its own name, it does not open as this one's.
	if err := a.PutManifest(ctx, archive.Manifest{SandboxID: "sbxb", Team: "t2"}); err != nil {
		t.Fatal(err)
	}
	srv.Put(t, "cluster-a/sandboxes/sbxa/manifest", srv.Object(t, "cluster-a/sandboxes/sbxb/manifest"))
	if _, err := a.Manifest(ctx, "sbxa"); !errors.Is(err, archive.ErrCorrupt) {
		t.Fatalf("a foreign manifest: %v, want ErrCorrupt", err)
	}
	// A state cut short.
	srv.Put(t, "cluster-a/sandboxes/sbxa/state", raw[:len(raw)-100])
	if err := a.OpenState(ctx, "sbxa", d, func(r io.Reader) error { _, err := io.Copy(io.Discard, r); return err }); !errors.Is(err, archive.ErrCorrupt) {
		t.Fatalf("a cut state: %v, want ErrCorrupt", err)
	}
	// Not there at all.
	if _, err := a.Manifest(ctx, "nosuch"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("missing manifest: %v, want not found", err)
	}
	// IDs never become other keys.
	if _, err := a.Manifest(ctx, "../sbxb"); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Fatalf("a path as ID: %v, want invalid argument", err)
	}
	for _, id := range []string{"sbxa", "sbxb"} {
		if err := a.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if keys := srv.Keys(t); len(keys) != 0 {
		t.Fatalf("objects left after Delete: %v", keys)
	}
}
