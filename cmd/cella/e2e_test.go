package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/cgroup"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/diskimage"
	"github.com/cella-sandbox/cella/internal/rootfs"
)

// daemonProc is a real `cella serve` process.
type daemonProc struct {
	t       *testing.T
	bin     string
	dataDir string
	url     string
	key     string
	cmd     *exec.Cmd
	log     *bytes.Buffer
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func startDaemon(t *testing.T, dataDir, listen string, serveArgs ...string) *daemonProc {
	t.Helper()
	bin, _ := daemontest.Binaries(t)
	daemontest.EnsureBase(t)
	d := &daemonProc{t: t, bin: bin, dataDir: dataDir, url: "http://" + listen, log: &bytes.Buffer{}}
	d.cmd = exec.Command(bin, append([]string{"serve", "--listen", listen, "--data-dir", dataDir, "--cache-dir", daemontest.CacheDir()}, serveArgs...)...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	d.cmd.Env = append(os.Environ(), "CELLA_HOST_CANARY=do-not-leak")
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			d.cmd.Process.Signal(syscall.SIGTERM)
			d.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.log.String())
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(d.url + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 204 {
				key, err := os.ReadFile(filepath.Join(dataDir, "admin.key"))
				if err != nil {
					t.Fatal(err)
				}
				d.key = strings.TrimSpace(string(key))
				return d
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("daemon did not come up; log:\n%s", d.log.String())
	return nil
}

// cella runs the CLI against the daemon and returns stdout, stderr, exit code.
func (d *daemonProc) cella(stdin string, args ...string) (string, string, int) {
	d.t.Helper()
	return d.cellaWith(d.key, stdin, args...)
}

// cellaWith runs the CLI with key (the admin's, or another).
func (d *daemonProc) cellaWith(key, stdin string, args ...string) (string, string, int) {
	d.t.Helper()
	cmd := exec.Command(d.bin, args...)
	cmd.Env = append(os.Environ(), "CELLA_URL="+d.url, "CELLA_API_KEY="+key)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		d.t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func (d *daemonProc) mustCella(args ...string) string {
	d.t.Helper()
	out, errs, code := d.cella("", args...)
	if code != 0 {
		d.t.Fatalf("cella %v: exit %d\nstdout %s\nstderr %s", args, code, out, errs)
	}
	return out
}

func (d *daemonProc) kill9() {
	d.cmd.Process.Signal(syscall.SIGKILL)
	d.cmd.Wait()
}

func (d *daemonProc) term() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		d.t.Fatal("daemon did not stop within 90 s of SIGTERM")
	}
}

func TestCLI(t *testing.T) {
	d := startDaemon(t, t.TempDir(), freePort(t))

	t.Run("Run", func(t *testing.T) {
		out := d.mustCella("run", "--", "python3", "-c", "print(6*7)")
		if out != "42\n" {
			t.Fatalf("cella run: %q", out)
		}
		if l := d.mustCella("ls", "--json"); strings.Contains(l, "sandboxID") {
			t.Fatalf("cella run left a sandbox: %s", l)
		}
		_, _, code := d.cella("", "run", "--", "sh", "-c", "exit 7")
		if code != 7 {
			t.Fatalf("cella run exit code: %d", code)
		}
	})
	t.Run("RunInterrupted", func(t *testing.T) {
		cmd := exec.Command(d.bin, "run", "--", "sh", "-c", "echo started; sleep 60")
		cmd.Env = append(os.Environ(), "CELLA_URL="+d.url, "CELLA_API_KEY="+d.key)
		var out bytes.Buffer
		cmd.Stdout = &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for !strings.Contains(out.String(), "started") && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		cmd.Process.Signal(os.Interrupt)
		err := cmd.Wait()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
			t.Fatalf("interrupted cella run: %v", err)
		}
		if l := d.mustCella("ls", "--json"); strings.Contains(l, "sandboxID") {
			t.Fatalf("interrupted cella run left a sandbox: %s", l)
		}
	})
	id := strings.TrimSpace(d.mustCella("create", "--timeout", "5m", "--env", "GREETING=hi", "--metadata", "owner=test", "--memory", "256M"))
	t.Cleanup(func() { d.cella("", "kill", id) })
	t.Run("Exec", func(t *testing.T) {
		out, errs, code := d.cella("", "exec", id, "--", "sh", "-c", "echo $GREETING; echo oops >&2; exit 3")
		if out != "hi\n" || errs != "oops\n" || code != 3 {
			t.Fatalf("exec: %q %q %d", out, errs, code)
		}
		out, _, code = d.cella("", "exec", "--json", id, "--", "sh", "-c", "echo a; exit 2")
		var res struct {
			ExitCode int    `json:"exit_code"`
			Stdout   string `json:"stdout"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil || res.ExitCode != 2 || res.Stdout != "a\n" || code != 2 {
			t.Fatalf("exec --json: %q %d", out, code)
		}
		out, _, _ = d.cella("piped input\n", "exec", id, "--", "cat")
		if out != "piped input\n" {
			t.Fatalf("stdin: %q", out)
		}
		out = d.mustCella("exec", "--user", "root", "--cwd", "/tmp", id, "--", "sh", "-c", "id -u; pwd")
		if out != "0\n/tmp\n" {
			t.Fatalf("--user/--cwd: %q", out)
		}
		out, errs, code = d.cella("", "exec", "--timeout", "1s", id, "--", "sleep", "30")
		if code != 137 || !strings.Contains(errs, "timeout") {
			t.Fatalf("--timeout: exit %d, stderr %q", code, errs)
		}
	})
	t.Run("LsInfoTimeout", func(t *testing.T) {
		if out := d.mustCella("ls"); !strings.Contains(out, id) {
			t.Fatalf("ls: %s", out)
		}
		info := d.mustCella("info", id)
		if !strings.Contains(info, `"owner": "test"`) || !strings.Contains(info, `"memoryMB": 256`) {
			t.Fatalf("info: %s", info)
		}
		d.mustCella("timeout", id, "10m")
		var rec struct {
			EndAt time.Time `json:"endAt"`
		}
		json.Unmarshal([]byte(d.mustCella("info", id)), &rec)
		if left := time.Until(rec.EndAt); left < 9*time.Minute || left > 11*time.Minute {
			t.Fatalf("timeout 10m: ends in %v", left)
		}
	})
	t.Run("Cp", func(t *testing.T) {
		dir := t.TempDir()
		src := filepath.Join(dir, "src")
		os.MkdirAll(filepath.Join(src, "sub"), 0o755)
		os.WriteFile(filepath.Join(src, "a.txt"), []byte("alpha"), 0o644)
		os.WriteFile(filepath.Join(src, "sub", "b.txt"), []byte("beta"), 0o644)
		d.mustCella("cp", filepath.Join(src, "a.txt"), id+":/home/user/a.txt")
		d.mustCella("cp", src, id+":/home/user/tree")
		out := d.mustCella("exec", id, "--", "sh", "-c", "cat /home/user/a.txt; echo; cat /home/user/tree/sub/b.txt; echo; stat -c %U /home/user/tree/sub/b.txt")
		if out != "alpha\nbeta\nuser\n" {
			t.Fatalf("cp up: %q", out)
		}
		d.mustCella("cp", id+":/home/user/tree", filepath.Join(dir, "back"))
		d.mustCella("cp", id+":/home/user/a.txt", filepath.Join(dir, "a-back.txt"))
		if b, _ := os.ReadFile(filepath.Join(dir, "back", "sub", "b.txt")); string(b) != "beta" {
			t.Fatalf("cp dir down: %q", b)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "a-back.txt")); string(b) != "alpha" {
			t.Fatalf("cp file down: %q", b)
		}
		_, errs, code := d.cella("", "cp", id+":/no/such/file", filepath.Join(dir, "x"))
		if code == 0 || !strings.Contains(errs, "not") {
			t.Fatalf("cp of a missing file: %d %q", code, errs)
		}
	})
	t.Run("Stats", func(t *testing.T) {
		out := d.mustCella("stats")
		t.Logf("cella stats:\n%s", out)
		if !strings.HasPrefix(out, "ID") || !strings.Contains(out, id) || !strings.Contains(out, "/ 256.0MiB") {
			t.Fatalf("stats (all running): %s", out)
		}
		var latest map[string]struct {
			MemTotal int64 `json:"memTotal"`
			DiskUsed int64 `json:"diskUsed"`
		}
		if err := json.Unmarshal([]byte(d.mustCella("stats", "--json", id)), &latest); err != nil || latest[id].MemTotal != 256<<20 || latest[id].DiskUsed <= 0 {
			t.Fatalf("stats --json %s: %+v %v", id, latest, err)
		}
		if out := d.mustCella("stats", "--history", "1h", id); strings.Count(out, id) < 1 {
			t.Fatalf("stats --history: %s", out)
		}
		out, errs, code := d.cella("", "stats", id, "nosuchsandbox")
		if code == 0 || !strings.Contains(out, id) || !strings.Contains(errs, "nosuchsandbox") {
			t.Fatalf("stats with an unknown ID: exit %d\n%s\n%s", code, out, errs)
		}
		if _, errs, code := d.cella("", "stats", "--history", "1h"); code == 0 || !strings.Contains(errs, "exactly one ID") {
			t.Fatalf("stats --history without an ID: exit %d %q", code, errs)
		}
	})
	t.Run("Kill", func(t *testing.T) {
		d.mustCella("kill", id)
		_, errs, code := d.cella("", "info", id)
		if code == 0 || !strings.Contains(errs, "404") {
			t.Fatalf("info after kill: %d %q", code, errs)
		}
	})
}

// hostLeftovers lists runtime containers, mounts, cgroups, processes and
// directories of the given sandboxes; with all set, anything at all of the
// data dir (runtime-wide mounts included).
func hostLeftovers(t *testing.T, dataDir, runsc string, ids []string, all bool) []string {
	var out []string
	mine := func(s string) bool {
		if all {
			return true
		}
		for _, id := range ids {
			if strings.Contains(s, id) {
				return true
			}
		}
		return false
	}
	ls, _ := exec.Command(runsc, "--root", filepath.Join(dataDir, "runsc"), "list", "-quiet").Output()
	for _, l := range strings.Fields(string(ls)) {
		if mine(l) {
			out = append(out, "container "+l)
		}
	}
	mounts, _ := rootfs.FindMounts(dataDir)
	for _, m := range mounts {
		if mine(m) {
			out = append(out, "mount "+m)
		}
	}
	// Freed loop devices are detached by the kernel shortly after.
	loops := diskimage.Loops(dataDir)
	if len(out) == 0 {
		loops = diskimage.WaitLoopsGone(dataDir, 10*time.Second)
	}
	for _, l := range loops {
		if mine(l.BackingFile) {
			out = append(out, "loop device "+l.Device+" on "+l.BackingFile)
		}
	}
	cgs, _ := cgroup.List()
	for _, c := range cgs {
		for _, id := range ids {
			if c == id {
				out = append(out, "cgroup "+c)
			}
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmdline := string(b)
		for _, id := range ids {
			if strings.Contains(cmdline, id) {
				out = append(out, "process "+strings.ReplaceAll(cmdline, "\x00", " "))
			}
		}
	}
	entries, _ := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
	for _, e := range entries {
		if mine(e.Name()) {
			out = append(out, "dir "+e.Name())
		}
	}
	return out
}

func TestCrashRecovery(t *testing.T) {
	_, runsc := daemontest.Binaries(t)
	dataDir := t.TempDir()
	listen := freePort(t)
	// An upstream on the host's loopback that the ceiling lets sandboxes
	// reach by name: an adopted sandbox must keep its egress.
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "upstream says hi") }))
	t.Cleanup(up.Close)
	upURL := "http://up.test:" + strings.TrimPrefix(up.URL, "http://127.0.0.1:") + "/"
	egressArgs := []string{"--egress-allow", "up.test", "--egress-resolve", "up.test=127.0.0.1"}
	curl := func(d *daemonProc, id string) string {
		t.Helper()
		out, errs, code := d.cella("", "exec", id, "--", "curl", "-sS", "-m", "10", upURL)
		if code != 0 {
			return fmt.Sprintf("exit %d: %s%s", code, out, errs)
		}
		return out
	}
	// Another daemon on its own data dir, with a sandbox that has written
	// to its disk: nothing the first daemon's crash recovery does touches
	// its mounts and loop devices.
	otherDir := t.TempDir()
	other := startDaemon(t, otherDir, freePort(t))
	otherID := strings.TrimSpace(other.mustCella("create", "--timeout", "10m"))
	other.mustCella("exec", otherID, "--", "sh", "-c", "head -c 8M /dev/zero > /home/user/other")
	otherMounts, _ := rootfs.FindMounts(otherDir)
	otherLoops := diskimage.Loops(otherDir)
	if len(otherMounts) == 0 || len(otherLoops) == 0 {
		t.Fatalf("the other daemon's sandbox: mounts %v, loops %+v", otherMounts, otherLoops)
	}

	d := startDaemon(t, dataDir, listen, egressArgs...)
	var ids []string
	for i := 0; i < 3; i++ {
		ids = append(ids, strings.TrimSpace(d.mustCella("create", "--timeout", "10m")))
	}
	d.mustCella("exec", ids[0], "--", "sh", "-c", "echo kept > /home/user/state; nohup sleep 1000 >/dev/null 2>&1 &")
	if out := curl(d, ids[0]); out != "upstream says hi" {
		t.Fatalf("egress before the crash: %q", out)
	}
	// A fourth sandbox is paused with memory, a counting process and a file.
	paused := strings.TrimSpace(d.mustCella("create", "--timeout", "10m"))
	d.mustCella("exec", paused, "--", "sh", "-c",
		"echo paused-file > /home/user/p; nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /home/user/count.tmp; mv -f /home/user/count.tmp /home/user/count; sleep 0.2; done' >/dev/null 2>&1 &")
	// The count is renamed into place: a reader sees a number or no file.
	count := func(d *daemonProc, above int) int {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			out := d.mustCella("exec", paused, "--", "sh", "-c", "cat /home/user/count 2>/dev/null || true")
			if n, err := strconv.Atoi(strings.TrimSpace(out)); err == nil && n > above {
				return n
			}
			if time.Now().After(deadline) {
				t.Fatalf("the counter does not pass %d: %q", above, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	before := count(d, 0)
	d.mustCella("pause", paused)

	// Crash with sandboxes running and one paused.
	d.kill9()
	// While the daemon is down, one sandbox's container goes away.
	exec.Command(runsc, "--root", filepath.Join(dataDir, "runsc"), "kill", "--all", ids[2], "KILL").Run()
	exec.Command(runsc, "--root", filepath.Join(dataDir, "runsc"), "delete", "--force", ids[2]).Run()
	// And a stray directory with no record appears.
	os.MkdirAll(filepath.Join(dataDir, "sandboxes", "strayzzzz", "run"), 0o700)

	d2 := startDaemon(t, dataDir, listen, egressArgs...)
	// A failure before the resume below would leave the paused sandbox to
	// outlive the test (a graceful stop keeps paused sandboxes): kill it
	// before d2 stops (cleanups run last-in first-out).
	t.Cleanup(func() {
		if d2.cmd.ProcessState == nil {
			d2.cella("", "kill", paused)
		}
	})
	// The surviving sandboxes were adopted and still hold their state,
	// and their egress: the network slot was adopted with them.
	if out := d2.mustCella("exec", ids[0], "--", "cat", "/home/user/state"); out != "kept\n" {
		t.Fatalf("adopted sandbox state: %q", out)
	}
	if out := curl(d2, ids[0]); out != "upstream says hi" {
		t.Fatalf("egress of a sandbox adopted after a crash: %q", out)
	}

	d2.mustCella("exec", ids[1], "--", "true")
	// The paused one is still paused, and resumes whole: its file, and its
	// process counting on from where it was.
	if info := d2.mustCella("info", paused); !strings.Contains(info, `"state": "paused"`) {
		t.Fatalf("paused sandbox after the crash: %s", info)
	}
	d2.mustCella("resume", paused)
	if out := d2.mustCella("exec", paused, "--", "cat", "/home/user/p"); out != "paused-file\n" {
		t.Fatalf("paused sandbox file after crash + resume: %q", out)
	}
	// It counts on from where it was (count fails the test if it does not).
	count(d2, before)
	// The one whose container vanished is reported dead, with the reason.
	info, errs, code := d2.cella("", "info", ids[2])
	if code != 0 || !strings.Contains(info, `"state": "dead"`) || !strings.Contains(info, "daemon was down") {
		t.Fatalf("vanished sandbox: %d %s %s", code, info, errs)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "sandboxes", "strayzzzz")); err == nil {
		t.Fatal("stray sandbox dir survived reconciliation")
	}
	if l := hostLeftovers(t, dataDir, runsc, ids[2:], false); len(l) > 0 {
		t.Fatalf("dead sandbox left: %v", l)
	}
	// The other daemon's sandbox kept its mounts, its loop devices, its data.
	if m, _ := rootfs.FindMounts(otherDir); !slices.Equal(m, otherMounts) {
		t.Fatalf("the other daemon's mounts changed: %v, was %v", m, otherMounts)
	}
	if l := diskimage.Loops(otherDir); !slices.Equal(l, otherLoops) {
		t.Fatalf("the other daemon's loop devices changed: %+v, was %+v", l, otherLoops)
	}
	if out := other.mustCella("exec", otherID, "--", "sh", "-c", "wc -c < /home/user/other"); out != "8388608\n" {
		t.Fatalf("the other daemon's sandbox after the first one's recovery: %q", out)
	}
	// A second crash: the channel credentials the adopted and resumed
	// agents were given by d2 are in their records, so the next daemon
	// takes them back too.
	d2.kill9()
	d3 := startDaemon(t, dataDir, listen, egressArgs...)
	if out := d3.mustCella("exec", ids[0], "--", "cat", "/home/user/state"); out != "kept\n" {
		t.Fatalf("sandbox adopted twice: %q", out)
	}
	if out := d3.mustCella("exec", paused, "--", "cat", "/home/user/p"); out != "paused-file\n" {
		t.Fatalf("resumed sandbox adopted after a second crash: %q", out)
	}
	// A clean stop leaves nothing at all.
	ids = append(ids, paused)
	d3.term()
	if l := hostLeftovers(t, dataDir, runsc, ids, true); len(l) > 0 {
		t.Fatalf("after SIGTERM the host still holds: %v", l)
	}
	if m, _ := rootfs.FindMounts(otherDir); !slices.Equal(m, otherMounts) {
		t.Fatalf("the other daemon's mounts changed at the first one's stop: %v, was %v", m, otherMounts)
	}
	other.mustCella("kill", otherID)
	other.term()
	if l := hostLeftovers(t, otherDir, runsc, []string{otherID}, true); len(l) > 0 {
		t.Fatalf("the other daemon left: %v", l)
	}
}
