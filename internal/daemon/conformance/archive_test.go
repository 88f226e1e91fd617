package conformance

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/archive"
	"github.com/cella-sandbox/cella/internal/archive/s3test"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// TestArchiveS3: `cella serve --archive` against a real S3 server
// (versitygw on loopback). A pause uploads the sandbox's layer and memory,
// sealed (the memory image holds the sandbox's environment in clear; the
// objects do not), and drops the local copy; a resume pulls it back and a
// background counter goes on from where it was; the objects go once it
// runs, and with a kill. A second daemon on another data dir (another
// node: only the archive key shared) imports the sandbox on resume — but
// not for another team's key, not from a tampered object, not from a
// crafted tar that climbs out of its directory, whose digest is right.
func TestArchiveS3(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	cfg := daemon.ArchiveConfig{URL: srv.URL("nodes"), Endpoint: srv.Endpoint}
	a := daemontest.Start(t, runtime.GVisor, daemontest.Options{Archive: cfg})
	dataDir = a.DataDir
	ctx := ctxT(t, 15*time.Minute)

	const secret = "archived-secret-5f1c9e77"
	sb := create(t, a, client.CreateRequest{EnvVars: map[string]string{"PLAIN_SECRET": secret}})
	mustOK(t, sb, `echo kept > /home/user/kept && head -c 12000000 /dev/urandom > /home/user/big && sha256sum /home/user/big > /home/user/big.sum`)
	startCounter(t, sb)
	n := waitCountAbove(t, sb, 3)

	pauseArchived(t, a, srv, sb.ID)
	state := srv.Object(t, "nodes/sandboxes/"+sb.ID+"/state")
	manifest := srv.Object(t, "nodes/sandboxes/"+sb.ID+"/manifest")
	if bytes.Contains(state, []byte(secret)) || bytes.Contains(manifest, []byte(secret)) {
		t.Fatal("an archived object holds the sandbox's environment in clear")
	}
	if _, err := gzip.NewReader(bytes.NewReader(state)); err == nil {
		t.Fatal("the archived state is a plain gzip stream")
	}
	// What a checkpoint holds: opened with the key, the memory image has
	// the environment's values (which is why the objects are sealed).
	key, err := daemon.StandaloneArchiveKey(a.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	if !plainHolds(t, key, "sandboxes/"+sb.ID+"/state", state, secret) {
		t.Error("the opened state does not hold the environment's value: what does a checkpoint keep?")
	}

	// Resume here: pulled back, the counter goes on.
	start := time.Now()
	if _, err := a.Client.Connect(ctx, sb.ID); err != nil {
		t.Fatalf("resume from the archive: %v", err)
	}
	t.Logf("resume from the archive on the same daemon: %v", time.Since(start).Round(time.Millisecond))
	n = waitCountAbove(t, sb, n)
	if out := mustOK(t, sb, "cat /home/user/kept && sha256sum -c /home/user/big.sum"); out != "kept\n/home/user/big: OK\n" {
		t.Fatalf("files after the resume: %q", out)
	}
	if keys := srv.Keys(t, "/agents/"); len(keys) != 0 {
		t.Fatalf("objects left once the sandbox runs again: %v", keys)
	}

	// Another node: a daemon on a new data dir, the same archive key (a
	// standalone daemon's is its master key's; a cluster's is a Secret).
	pauseArchived(t, a, srv, sb.ID)
	state = srv.Object(t, "nodes/sandboxes/"+sb.ID+"/state")
	manifest = srv.Object(t, "nodes/sandboxes/"+sb.ID+"/manifest")
	bdir := tempDataDir(t)
	master, err := os.ReadFile(filepath.Join(a.DataDir, "master.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bdir, "master.key"), master, 0o600); err != nil {
		t.Fatal(err)
	}
	// ... running another build of the agent: the sandbox's memory holds
	// the first one's text, which is carried from the archive.
	bin := daemontest.Agent(t)
	otherAgent := append(slices.Clone(bin), make([]byte, 4096)...)
	b := daemontest.Start(t, runtime.GVisor, daemontest.Options{DataDir: bdir, Archive: cfg, Agent: otherAgent})
	t.Cleanup(func() { _ = b.Client.Kill(context.Background(), sb.ID) })
	bsb := filepath.Join(bdir, "sandboxes", sb.ID)

	// Another team's key: the not-found of an unknown sandbox, nothing made.
	other, err := b.Client.CreateKey(ctx, client.NewKey{Name: "other", Team: "other-team"})
	if err != nil {
		t.Fatal(err)
	}
	oc, err := client.New(client.Config{URL: b.URL, APIKey: other.Key})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oc.Connect(ctx, sb.ID); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("another team resumed the archive: %v", err)
	}
	if _, err := os.Stat(bsb); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("another team's resume left %s: %v", bsb, err)
	}

	// A flipped bit in the state: refused, the sandbox stays paused.
	srv.Put(t, "nodes/sandboxes/"+sb.ID+"/state", flipByte(state, len(state)/2))
	if _, err := b.Client.Connect(ctx, sb.ID); err == nil || !strings.Contains(err.Error(), "does not authenticate") {
		t.Fatalf("resume from a tampered state: %v", err)
	}
	checkNoLayer(t, bsb)

	// A crafted tar, sealed with the key and with its digest in the
	// manifest: refused by the extraction, nothing written outside.
	outside := t.TempDir()
	arch := bucketArchive(t, srv, cfg, key)
	m, err := arch.Manifest(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if m.State, err = arch.PutState(ctx, sb.ID, func(w io.Writer) error { return craftedTar(w, outside) }); err != nil {
		t.Fatal(err)
	}
	if err := arch.PutManifest(ctx, m); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Client.Connect(ctx, sb.ID); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("resume from a crafted tar: %v", err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("the crafted tar wrote outside its directory: %v", ents)
	}
	checkNoLayer(t, bsb)

	// The real objects back: the second node resumes it, memory and files.
	srv.Put(t, "nodes/sandboxes/"+sb.ID+"/state", state)
	srv.Put(t, "nodes/sandboxes/"+sb.ID+"/manifest", manifest)
	start = time.Now()
	if _, err := b.Client.Connect(ctx, sb.ID); err != nil {
		t.Fatalf("resume on the second node: %v", err)
	}
	t.Logf("resume from the archive on a daemon that never had it (import): %v", time.Since(start).Round(time.Millisecond))
	bconn, err := b.Client.Sandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	waitCountAbove(t, bconn, n)
	sum := sha256.Sum256(bin)
	carried := filepath.Join(bdir, "agent-binaries", hex.EncodeToString(sum[:]))
	if _, err := os.Stat(carried); err != nil {
		t.Fatalf("the first daemon's agent was not carried to the second: %v", err)
	}
	if out := mustOK(t, bconn, "cat /home/user/kept && sha256sum -c /home/user/big.sum && echo $PLAIN_SECRET"); out != "kept\n/home/user/big: OK\n"+secret+"\n" {
		t.Fatalf("files after the cross-node resume: %q", out)
	}
	if keys := srv.Keys(t, "/agents/"); len(keys) != 0 {
		t.Fatalf("objects left once the sandbox runs on the second node: %v", keys)
	}

	// A kill of an archived sandbox deletes its objects; nothing is left.
	pauseArchived(t, b, srv, sb.ID)
	if err := b.Client.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if keys := srv.Keys(t, "/agents/"); len(keys) != 0 {
		t.Fatalf("objects left after the kill: %v", keys)
	}
	if _, err := os.Stat(bsb); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the killed sandbox's dir is left: %v", err)
	}
	waitFor(t, 30*time.Second, "the carried agent pruned once no sandbox runs it", func() bool {
		_, err := os.Stat(carried)
		return errors.Is(err, os.ErrNotExist)
	})
	// The agents stay in the store (content-addressed, shared); nothing
	// of the sandbox does.
	for _, k := range srv.Keys(t) {
		if !strings.HasPrefix(k, "nodes/agents/") {
			t.Fatalf("object left after the kill: %s", k)
		}
	}
	b.Close()
	if left := daemontest.MountsUnder(bdir); len(left) > 0 {
		t.Fatalf("the second daemon left mounts: %v", left)
	}
}

// pauseArchived pauses id with its memory and checks it went to the
// archive: its two objects there, no layer or checkpoint left here.
func pauseArchived(t *testing.T, env *daemontest.Env, srv *s3test.Server, id string) {
	t.Helper()
	if err := env.Client.Pause(ctxT(t, 5*time.Minute), id, true); err != nil {
		t.Fatalf("pause: %v", err)
	}
	v, err := lifecycleOf(t, env, id)
	if err != nil {
		t.Fatal(err)
	}
	if v.State != "paused" || !v.Lifecycle.Archived || !strings.HasPrefix(v.Lifecycle.ArchivePath, "s3://"+srv.Bucket+"/nodes/sandboxes/"+id) {
		t.Fatalf("after pause: %+v", v)
	}
	want := []string{"nodes/sandboxes/" + id + "/manifest", "nodes/sandboxes/" + id + "/state"}
	if keys := srv.Keys(t, "/agents/"); !slices.Equal(keys, want) {
		t.Fatalf("objects %v, want %v", keys, want)
	}
	checkNoLayer(t, filepath.Join(env.DataDir, "sandboxes", id))
}

// checkNoLayer: a sandbox dir without a writable layer, a checkpoint or a
// mount.
func checkNoLayer(t *testing.T, dir string) {
	t.Helper()
	for _, name := range []string{"layer.img", "checkpoint", "rootfs/etc"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s is left in %s: %v", name, dir, err)
		}
	}
	if left := daemontest.MountsUnder(dir); len(left) > 0 {
		t.Fatalf("mounts left under %s: %v", dir, left)
	}
}

func flipByte(b []byte, i int) []byte {
	c := slices.Clone(b)
	c[i] ^= 0x40
	return c
}

func bucketArchive(t *testing.T, srv *s3test.Server, cfg daemon.ArchiveConfig, key []byte) *archive.Archive {
	t.Helper()
	bk, err := archive.NewS3(context.Background(), archive.S3Config{URL: cfg.URL, Endpoint: cfg.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	a, err := archive.New(bk, key)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// plainHolds opens a sealed state and reports whether any file in it
// holds s.
func plainHolds(t *testing.T, key []byte, name string, sealed []byte, s string) bool {
	t.Helper()
	r, err := archive.Open(bytes.NewReader(sealed), key, name)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		if _, err := tr.Next(); err != nil {
			if err != io.EOF {
				t.Fatal(err)
			}
			return false
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(s)) {
			return true
		}
	}
}

// craftedTar is a sandbox state whose upper holds a symlink to outside and
// then a file through it.
func craftedTar(w io.Writer, outside string) error {
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	for _, h := range []*tar.Header{
		{Name: "upper/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "upper/escape", Typeflag: tar.TypeSymlink, Linkname: outside},
		{Name: "upper/escape/planted", Typeflag: tar.TypeReg, Mode: 0o644, Size: 5},
	} {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte("owned")); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// tempDataDir is a data dir for a daemon of the test's own, removed (if
// nothing is mounted in it) when the test ends.
func tempDataDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "cella-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if left := daemontest.MountsUnder(d); len(left) > 0 {
			t.Errorf("mounts left under %s: %v", d, left)
			return
		}
		os.RemoveAll(d)
	})
	return d
}
