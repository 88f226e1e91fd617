package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSoakFindsLeftovers: the soak's leak checks see what a daemon could
// leave of a sandbox (a mount under its dir, a process naming the data
// dir, its directory) and a network slot beyond the running sandboxes and
// the pool, and see nothing once they are gone.
func TestSoakFindsLeftovers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts need root")
	}
	work := t.TempDir()
	d := &soakDaemon{dataDir: filepath.Join(work, "data"), poolSize: 1, rt: "gvisor"}
	const id = "soakleaktest0000001"
	rootfs := filepath.Join(d.dataDir, "sandboxes", id, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := d.resourcesOf(id); len(got) != 1 || !strings.Contains(got[0], "state of "+id) {
		t.Fatalf("a sandbox dir: %q", got)
	}
	if err := unix.Mount("tmpfs", rootfs, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(rootfs, unix.MNT_DETACH)
	// A process started with a path under the data dir, as runsc is (two
	// commands, so that sh stays with its arguments).
	stray := exec.Command("/bin/sh", "-c", "sleep 300; :", filepath.Join(d.dataDir, "runsc", id))
	stray.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := stray.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() { _ = syscall.Kill(-stray.Process.Pid, syscall.SIGKILL); _ = stray.Wait() }
	defer stop()
	var got []string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got = d.resourcesOf(id); len(got) == 3 {
			break
		}
	}
	joined := strings.Join(got, "\n")
	for _, want := range []string{"mount of " + id + ": " + rootfs, "process of " + id + ": ", "state of " + id} {
		if !strings.Contains(joined, want) {
			t.Errorf("leftovers %q lack %q", got, want)
		}
	}

	// Two slots for no running sandbox and a pool of one: one too many.
	for _, slot := range []string{"na-s", "na-o", "nb-s", "nb-o"} {
		p := filepath.Join(d.dataDir, "net", slot)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", p, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		defer unix.Unmount(p, unix.MNT_DETACH)
	}
	if l := d.slotLeaks(0); len(l) != 1 || !strings.Contains(l[0], "network slots: 2 (na, nb)") {
		t.Errorf("slot leaks: %q", l)
	}
	if l := d.slotLeaks(1); len(l) != 0 {
		t.Errorf("slot leaks with one sandbox running: %q", l)
	}

	stop()
	if err := unix.Unmount(rootfs, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(d.dataDir, "sandboxes", id)); err != nil {
		t.Fatal(err)
	}
	if got := d.resourcesOf(id); len(got) != 0 {
		t.Errorf("after cleanup: %q", got)
	}
}
