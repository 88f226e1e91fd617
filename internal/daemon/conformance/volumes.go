package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/rootfs"
)

// testVolumes: one volume shared by two sandboxes (one writes, the other
// reads through a read-only mount that refuses writes), ENOSPC at the size
// limit, 409 while in use, and the data outliving both sandboxes.
func testVolumes(t *testing.T, env *daemontest.Env) {
	ctx := ctxT(t, 5*time.Minute)
	name := fmt.Sprintf("conf-%d", time.Now().UnixNano()%1e9)
	if _, err := env.Client.CreateVolume(ctx, name, 32); err != nil {
		t.Fatalf("create volume: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.DeleteVolume(context.Background(), name) })

	writer := create(t, env, client.CreateRequest{VolumeMounts: []client.VolumeMount{{Name: name, Path: "/mnt/vol"}}})
	reader := create(t, env, client.CreateRequest{VolumeMounts: []client.VolumeMount{{Name: name, Path: "/data/shared", ReadOnly: true}}})

	// Volume mounts name no host path either (hardening.go).
	t.Run("MountinfoNoHostPaths", func(t *testing.T) { testMountinfoNoHostPaths(t, env, reader) })
	// The default user (uid 1000) writes; root too.
	mustOK(t, writer, "echo shared-data > /mnt/vol/file && mkdir -p /mnt/vol/dir && id -u > /mnt/vol/dir/uid")
	run(t, writer, "echo by-root > /mnt/vol/rootfile", client.ExecOptions{User: "root"})
	if out := mustOK(t, reader, "cat /data/shared/file /data/shared/dir/uid /data/shared/rootfile"); out != "shared-data\n1000\nby-root\n" {
		t.Fatalf("reader sees %q", out)
	}
	if out := mustOK(t, reader, "stat -c %u /data/shared/file"); out != "1000\n" {
		t.Fatalf("owner of a file written by uid 1000 as the reader sees it: %q", out)
	}
	// Read-only: refused for the user and for root.
	for _, user := range []string{"", "root"} {
		res := run(t, reader, "echo x > /data/shared/new", client.ExecOptions{User: user})
		if res.ExitCode == 0 || !strings.Contains(strings.ToLower(res.Stderr), "read-only") {
			t.Fatalf("write to a read-only volume as %q: exit %d, stderr %q", user, res.ExitCode, res.Stderr)
		}
	}
	// A write goes live to the other sandbox.
	mustOK(t, writer, "echo second > /mnt/vol/file")
	if out := mustOK(t, reader, "cat /data/shared/file"); out != "second\n" {
		t.Fatalf("reader after rewrite: %q", out)
	}
	// The size limit is a real ENOSPC.
	res := run(t, writer, "dd if=/dev/zero of=/mnt/vol/big bs=1M count=64", client.ExecOptions{Timeout: time.Minute})
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") || !strings.Contains(res.Error, "volume at /mnt/vol is full") {
		t.Fatalf("64 MiB into a 32 MiB volume: exit %d, error %q, stderr %q", res.ExitCode, res.Error, res.Stderr)
	}
	mustOK(t, writer, "rm /mnt/vol/big")
	// The sandbox's own disk is untouched by the volume.
	if out := mustOK(t, writer, "df -P / /mnt/vol | tail -n +2 | wc -l"); out != "2\n" {
		t.Fatalf("df: %q", out)
	}

	// In use: 409.
	err := env.Client.DeleteVolume(ctx, name)
	if !client.IsConflict(err) {
		t.Fatalf("delete of a volume in use: want 409, got %v", err)
	}

	// The data outlives both sandboxes.
	for _, sb := range []*client.SandboxConn{writer, reader} {
		if err := env.Client.Kill(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	again := create(t, env, client.CreateRequest{VolumeMounts: []client.VolumeMount{{Name: name, Path: "/home/user/vol"}}})
	if out := mustOK(t, again, "cat /home/user/vol/file"); out != "second\n" {
		t.Fatalf("a new sandbox sees %q", out)
	}
	if err := env.Client.Kill(ctx, again.ID); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.DeleteVolume(ctx, name); err != nil {
		t.Fatalf("delete of an unused volume: %v", err)
	}
	if _, err := os.Stat(filepath.Join(env.DataDir, "volumes", name)); !os.IsNotExist(err) {
		t.Fatalf("volume dir left after delete: %v", err)
	}
}

// lifecycleView is the part of GET /sandboxes/{id} these tests read.
type lifecycleView struct {
	State     string `json:"state"`
	PauseMode string `json:"pauseMode"`
	Lifecycle struct {
		OnTimeout          string  `json:"onTimeout"`
		AutoResume         bool    `json:"autoResume"`
		AutoStopSeconds    float64 `json:"autoStopSeconds"`
		AutoArchiveSeconds float64 `json:"autoArchiveSeconds"`
		AutoDeleteSeconds  float64 `json:"autoDeleteSeconds"`
		Archived           bool    `json:"archived"`
		ArchivePath        string  `json:"archivePath"`
	} `json:"lifecycle"`
	NextTransition *struct {
		Action string    `json:"action"`
		At     time.Time `json:"at"`
	} `json:"nextTransition"`
}

func lifecycleOf(t *testing.T, env *daemontest.Env, id string) (lifecycleView, error) {
	t.Helper()
	d, err := env.Client.Get(ctxT(t, time.Minute), id)
	if err != nil {
		return lifecycleView{}, err
	}
	var v lifecycleView
	if err := json.Unmarshal(d.Raw, &v); err != nil {
		t.Fatal(err)
	}
	return v, nil
}

// waitFor polls cond every 100 ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// testLifecyclePolicies: idle auto-stop with auto-resume on the next
// request, auto-archive (archive file, tmpfs freed, files and — with memory
// checkpoints — processes back on resume) and auto-delete, each shown in the
// detail's policy and nextTransition first.
func testLifecyclePolicies(t *testing.T, env *daemontest.Env) {
	t.Run("AutoStopAndResume", func(t *testing.T) {
		yes := true
		sb := create(t, env, client.CreateRequest{Lifecycle: client.Lifecycle{AutoStopSeconds: client.Seconds(2 * time.Second), AutoResume: &yes}})
		mustOK(t, sb, "echo before > /home/user/f")
		v, err := lifecycleOf(t, env, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if v.Lifecycle.AutoStopSeconds != 2 || !v.Lifecycle.AutoResume || v.NextTransition == nil || v.NextTransition.Action != "pause" ||
			time.Until(v.NextTransition.At) > 3*time.Second {
			t.Fatalf("detail before idle: %+v next=%+v", v.Lifecycle, v.NextTransition)
		}
		// A command longer than the idle time keeps it running.
		mustOK(t, sb, "sleep 3")
		if v, _ := lifecycleOf(t, env, sb.ID); v.State != "running" {
			t.Fatalf("paused during a command: %q", v.State)
		}
		waitFor(t, 15*time.Second, "the idle auto-stop", func() bool {
			v, err := lifecycleOf(t, env, sb.ID)
			return err == nil && v.State == "paused"
		})
		// The first request resumes it (autoResume).
		if out := mustOK(t, sb, "cat /home/user/f"); out != "before\n" {
			t.Fatalf("after auto-resume: %q", out)
		}
		if v, _ := lifecycleOf(t, env, sb.ID); v.State != "running" {
			t.Fatalf("after the request: %q", v.State)
		}
	})

	t.Run("AutoArchive", func(t *testing.T) {
		sb := create(t, env, client.CreateRequest{Lifecycle: client.Lifecycle{AutoArchiveSeconds: client.Seconds(time.Second)}})
		mustOK(t, sb, "echo archived-file > /home/user/a && mkdir -p /home/user/d && ln -s a /home/user/link")
		// A deleted template file is an overlay whiteout in the archive.
		if res := run(t, sb, "rm -f /etc/motd", client.ExecOptions{User: "root"}); res.ExitCode != 0 {
			t.Fatalf("rm /etc/motd: %+v", res)
		}
		startCounter(t, sb)
		n := waitCountAbove(t, sb, 1)
		ctx := ctxT(t, 3*time.Minute)
		if err := env.Client.Pause(ctx, sb.ID, true); err != nil {
			t.Fatal(err)
		}
		v, err := lifecycleOf(t, env, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if v.NextTransition == nil || v.NextTransition.Action != "archive" {
			// It may be archived already (1 s).
			if !v.Lifecycle.Archived {
				t.Fatalf("paused detail: next=%+v lifecycle=%+v", v.NextTransition, v.Lifecycle)
			}
		}
		waitFor(t, 60*time.Second, "the auto-archive", func() bool {
			v, err := lifecycleOf(t, env, sb.ID)
			return err == nil && v.Lifecycle.Archived
		})
		archive := filepath.Join(env.DataDir, "archive", sb.ID+".tar.gz")
		if st, err := os.Stat(archive); err != nil || st.Size() == 0 {
			t.Fatalf("archive file: %v", err)
		}
		// The archive is the sandbox's state once the record says so; its
		// layer is unmounted and deleted right after.
		waitFor(t, 30*time.Second, "the archived sandbox's layer to be unmounted and deleted", func() bool {
			ms, err := rootfs.FindMounts(filepath.Join(env.DataDir, "sandboxes", sb.ID))
			_, serr := os.Stat(filepath.Join(env.DataDir, "sandboxes", sb.ID, rootfs.LayerImage))
			return err == nil && len(ms) == 0 && os.IsNotExist(serr)
		})
		if v, _ := lifecycleOf(t, env, sb.ID); v.State != "paused" || v.NextTransition != nil {
			t.Fatalf("archived detail: state %q next %+v", v.State, v.NextTransition)
		}
		if _, resumed, err := env.Client.ConnectResumed(ctx, sb.ID); err != nil || !resumed {
			t.Fatalf("resume of an archived sandbox: resumed=%v err=%v", resumed, err)
		}
		if out := mustOK(t, sb, "cat /home/user/a; readlink /home/user/link; test -d /home/user/d && echo dir; test -e /etc/motd || echo gone"); out != "archived-file\na\ndir\ngone\n" {
			t.Fatalf("files after unarchive: %q", out)
		}
		if _, err := os.Stat(archive); !os.IsNotExist(err) {
			t.Fatalf("archive left after resume: %v", err)
		}
		if env.Daemon.Runtime.Capabilities().MemoryCheckpoint {
			// gVisor: the checkpointed processes come back and go on.
			if c := readCount(t, sb); c < n {
				t.Fatalf("counter went back from %d to %d", n, c)
			}
			waitCountAbove(t, sb, readCount(t, sb))
		}
		mustOK(t, sb, "echo still-writable > /home/user/b")
	})

	t.Run("AutoArchiveFromSnapshot", func(t *testing.T) {
		// A sandbox made from a snapshot stacks on its layers: archived and
		// unarchived, it still does (the snapshot's files were lost).
		ctx := ctxT(t, 3*time.Minute)
		orig := create(t, env, client.CreateRequest{})
		mustOK(t, orig, "echo from-snapshot > /home/user/snapfile")
		name := "arch-snap-" + env.Daemon.Runtime.Name()
		if _, err := env.Client.Snapshot(ctx, orig.ID, name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { env.Client.DeleteSnapshot(context.Background(), name) })
		sb := create(t, env, client.CreateRequest{TemplateID: name, Lifecycle: client.Lifecycle{AutoArchiveSeconds: client.Seconds(time.Second)}})
		mustOK(t, sb, "echo own > /home/user/own")
		if err := env.Client.Pause(ctx, sb.ID, true); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 60*time.Second, "the auto-archive", func() bool {
			v, err := lifecycleOf(t, env, sb.ID)
			return err == nil && v.Lifecycle.Archived
		})
		if _, resumed, err := env.Client.ConnectResumed(ctx, sb.ID); err != nil || !resumed {
			t.Fatalf("resume: resumed=%v err=%v", resumed, err)
		}
		if out := mustOK(t, sb, "cat /home/user/snapfile /home/user/own"); out != "from-snapshot\nown\n" {
			t.Fatalf("files after unarchive: %q", out)
		}
	})

	t.Run("AutoDelete", func(t *testing.T) {
		ctx := ctxT(t, 3*time.Minute)
		sb := create(t, env, client.CreateRequest{Lifecycle: client.Lifecycle{AutoDeleteSeconds: client.Seconds(time.Second)}})
		if err := env.Client.Pause(ctx, sb.ID, true); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "the auto-delete", func() bool {
			_, err := env.Client.Get(ctx, sb.ID)
			return client.IsNotFound(err)
		})
		// Its host resources go right after the record.
		waitFor(t, 30*time.Second, "the sandbox dir to go", func() bool {
			_, err := os.Stat(filepath.Join(env.DataDir, "sandboxes", sb.ID))
			return os.IsNotExist(err)
		})
	})

	t.Run("ArchiveWithVolumeSurvivesDaemonRestart", func(t *testing.T) { testArchiveRestart(t, env) })

	t.Run("DetailShowsTTL", func(t *testing.T) {
		sb := create(t, env, client.CreateRequest{Timeout: new(int64(120))})
		v, err := lifecycleOf(t, env, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if v.NextTransition == nil || v.NextTransition.Action != "kill" || v.Lifecycle.OnTimeout != "kill" {
			t.Fatalf("next transition of a plain sandbox: %+v", v.NextTransition)
		}
	})
}

// testArchiveRestart: an archived sandbox with a volume is kept by a daemon
// restart (its state is the archive file and the volume image, not RAM) and
// resumes on the new daemon with its files, its volume and — with memory
// checkpoints — its processes.
func testArchiveRestart(t *testing.T, env *daemontest.Env) {
	dir, err := os.MkdirTemp("", "cella-test-archive-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	rtName := env.Daemon.Runtime.Name()
	env1 := daemontest.Start(t, rtName, daemontest.Options{DataDir: dir})
	ctx := ctxT(t, 3*time.Minute)
	if _, err := env1.Client.CreateVolume(ctx, "keep", 16); err != nil {
		t.Fatal(err)
	}
	sb := create(t, env1, client.CreateRequest{
		VolumeMounts: []client.VolumeMount{{Name: "keep", Path: "/mnt/keep"}},
		Lifecycle:    client.Lifecycle{AutoArchiveSeconds: client.Seconds(500 * time.Millisecond)},
	})
	id := sb.ID
	mustOK(t, sb, "echo layer > /home/user/l && echo vol > /mnt/keep/v")
	startCounter(t, sb)
	n := waitCountAbove(t, sb, 1)
	if err := env1.Client.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the auto-archive", func() bool {
		v, err := lifecycleOf(t, env1, id)
		return err == nil && v.Lifecycle.Archived
	})
	env1.Close()

	env2 := daemontest.Start(t, rtName, daemontest.Options{DataDir: dir})
	t.Cleanup(func() { _ = env2.Client.Kill(context.Background(), id) })
	v, err := lifecycleOf(t, env2, id)
	if err != nil || v.State != "paused" || !v.Lifecycle.Archived {
		t.Fatalf("archived sandbox after restart: %+v %v", v, err)
	}
	if _, resumed, err := env2.Client.ConnectResumed(ctx, id); err != nil || !resumed {
		t.Fatalf("resume after restart: resumed=%v err=%v", resumed, err)
	}
	sb2, err := env2.Client.Sandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if out := mustOK(t, sb2, "cat /home/user/l /mnt/keep/v"); out != "layer\nvol\n" {
		t.Fatalf("files after restart + unarchive: %q", out)
	}
	if env2.Daemon.Runtime.Capabilities().MemoryCheckpoint {
		if c := readCount(t, sb2); c < n {
			t.Fatalf("counter went back from %d to %d", n, c)
		}
		waitCountAbove(t, sb2, readCount(t, sb2))
	}
	if err := env2.Client.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := env2.Client.DeleteVolume(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
}
