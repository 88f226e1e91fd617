package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/agentapi"
)

func landlockABI() int {
	const createRulesetVersion = 1
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, createRulesetVersion)
	if errno != 0 {
		return 0
	}
	return int(v)
}

// TestLandlockHelper runs commands through the exec helper (this test
// binary, see TestMain) the way the agent does under the namespaces runtime.
func TestLandlockHelper(t *testing.T) {
	if landlockABI() < 1 {
		t.Skip("kernel without landlock")
	}
	// The helper must be executable by the test user; the test binary's
	// own directory is private to root.
	helperDir, err := os.MkdirTemp("/var/cache", "cella-landlock-helper-")
	if err != nil {
		t.Skip("no /var/cache to test with")
	}
	t.Cleanup(func() { os.RemoveAll(helperDir) })
	if err := os.Chmod(helperDir, 0o755); err != nil {
		t.Fatal(err)
	}
	helper := filepath.Join(helperDir, "cella")
	bin, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(helper, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	e := newTestEnv(t, func(c *agentapi.Config, o *Options) {
		c.Runtime = "namespaces"
		o.ExecHelper = helper
	})
	ctx := ctxT(t, 20*time.Second)

	// A private dir standing in for /run/cella (outside /tmp, which users
	// may write), and a world-writable dir outside the user's areas.
	private := filepath.Join(helperDir, "private")
	writeFile(t, filepath.Join(private, "config.json"), "secret")
	open := filepath.Join(e.rootDir, "open")
	if err := os.MkdirAll(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(e.rootDir, "readable.txt"), "readable")

	env := map[string]string{"CELLA_TEST_PRIVATE_DIR": private}
	script := strings.Join([]string{
		"cat " + filepath.Join(private, "config.json") + " >/dev/null 2>&1 && echo private=yes || echo private=no",
		"cat " + filepath.Join(e.rootDir, "readable.txt") + " >/dev/null 2>&1 && echo read=yes || echo read=no",
		"touch " + filepath.Join(open, "f") + " 2>/dev/null && echo openw=yes || echo openw=no",
		"touch /tmp/cella-landlock-test-$$ 2>/dev/null && echo tmpw=yes && rm -f /tmp/cella-landlock-test-$$ || echo tmpw=no",
		"echo home=$(cd && touch h && echo yes)",
	}, "; ")

	// root: everything but the private dir's contents. (Its names can be
	// listed: the rights on its ancestors are inherited.)
	req := bashReq(script)
	req.Process.Envs = env
	r := e.run(ctx, req)
	for _, want := range []string{"private=no", "read=yes", "openw=yes", "tmpw=yes"} {
		if !strings.Contains(r.stdout, want+"\n") {
			t.Errorf("root: want %s in %q (stderr %q)", want, r.stdout, r.stderr)
		}
	}

	// user: world-writable places outside /home, /tmp, /var/tmp, /dev are
	// read-only. /tmp itself stays writable, so use /var/cache for the
	// outside place.
	outside := filepath.Join(helperDir, "outside")
	if err := os.Mkdir(outside, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(outside, 0o777); err != nil {
		t.Fatal(err)
	}
	script = "touch " + filepath.Join(outside, "f") + " 2>/dev/null && echo outw=yes || echo outw=no; " +
		"cat " + filepath.Join(private, "config.json") + " >/dev/null 2>&1 && echo private=yes || echo private=no; " +
		"touch /tmp/cella-landlock-user-$$ 2>/dev/null && echo tmpw=yes && rm -f /tmp/cella-landlock-user-$$ || echo tmpw=no; " +
		"echo dev=$(echo x > /dev/null && echo yes)"
	req = bashReq(script)
	req.Process.Envs = env
	r = e.run(ctx, req, "Authorization", basicAuth("user"))
	for _, want := range []string{"outw=no", "private=no", "tmpw=yes", "dev=yes"} {
		if !strings.Contains(r.stdout, want+"\n") {
			t.Errorf("user: want %s in %q (stderr %q)", want, r.stdout, r.stderr)
		}
	}

	// Without the helper (gvisor runtime) the same write succeeds, which
	// shows the denial above came from Landlock, not file modes.
	plain := newTestEnv(t)
	r = plain.run(ctx, bashReq("touch "+filepath.Join(outside, "g")+" && echo outw=yes"), "Authorization", basicAuth("user"))
	if r.stdout != "outw=yes\n" {
		t.Fatalf("without landlock: %q %q", r.stdout, r.stderr)
	}
}

func TestExecHelperArgs(t *testing.T) {
	if err := ExecHelperMain([]string{"user"}); err == nil {
		t.Fatal("short args accepted")
	}
	if err := ExecHelperMain([]string{"admin", "/bin/true", "true"}); err == nil {
		t.Fatal("bad mode accepted")
	}
}
