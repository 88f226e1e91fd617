package build_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/build/dockerfile"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/image/registrytest"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// env is a real daemon (gVisor) and a team of its own, so that the build
// cache starts empty for each test.
type env struct {
	*daemontest.Env
	t    *testing.T
	team tenant.Principal
}

func start(t *testing.T, o daemontest.Options) *env {
	t.Helper()
	e := &env{Env: daemontest.Start(t, runtime.GVisor, o), t: t}
	e.team = tenant.Principal{Key: "k-" + rnd(), Team: "team-" + rnd()}
	return e
}

func rnd() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// logs collects a build's log.
type logs struct {
	mu      sync.Mutex
	entries []build.LogEntry
}

func (l *logs) add(e build.LogEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, e)
}

func (l *logs) messages() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.entries {
		out = append(out, e.Step+"|"+e.Message)
	}
	return out
}

func (l *logs) has(sub string) bool {
	return slices.ContainsFunc(l.messages(), func(m string) bool { return strings.Contains(m, sub) })
}

// build runs spec for e's team with a unique template name (removed when
// the test ends) and returns the result, the log and the error.
func (e *env) build(spec build.Spec, files build.Files) (build.Result, *logs, error) {
	e.t.Helper()
	l := &logs{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := e.Daemon.Builder.Build(ctx, e.team, spec, files, l.add)
	for _, m := range l.messages() {
		e.t.Log("build log: " + m)
	}
	return res, l, err
}

func (e *env) name() string {
	n := "bt-" + rnd()
	e.t.Cleanup(func() {
		if err := e.Daemon.Templates.Delete(n); err != nil && !strings.Contains(err.Error(), "not found") {
			e.t.Errorf("remove template %s: %v", n, err)
		}
	})
	return n
}

// sandboxesMade counts the sandboxes the daemon ever made (each leaves an
// audit log).
func (e *env) sandboxesMade() int {
	ents, _ := os.ReadDir(filepath.Join(e.DataDir, "audit"))
	return len(ents)
}

// run creates a sandbox of tpl, runs cmd in it and kills it.
func (e *env) run(tpl, cmd string, o client.ExecOptions) client.ExecResult {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := e.Client.Create(ctx, client.CreateRequest{TemplateID: tpl})
	if err != nil {
		e.t.Fatalf("create from %s: %v", tpl, err)
	}
	defer e.Client.Kill(context.Background(), sb.SandboxID)
	conn, err := e.Client.Sandbox(ctx, sb.SandboxID)
	if err != nil {
		e.t.Fatal(err)
	}
	res, err := conn.Exec(ctx, cmd, o)
	if err != nil {
		e.t.Fatalf("exec %q: %v", cmd, err)
	}
	return res
}

func TestStepsInSandboxAndCache(t *testing.T) {
	e := start(t, daemontest.Options{})
	name := e.name()
	spec := build.Spec{Name: name, Base: build.Base{Template: "base"}, Steps: []build.Step{
		{Type: "RUN", Args: []string{"echo built by $(id -un) > ~/first; chmod 755 ~; echo hello from the build"}},
		{Type: "ENV", Args: []string{"GREETING", "hi", "BOTH", "$GREETING there"}},
		{Type: "WORKDIR", Args: []string{"/srv/app"}},
		{Type: "USER", Args: []string{"alice"}},
		{Type: "RUN", Args: []string{"echo $BOTH > ~/env; pwd > ~/cwd; touch /srv/app/made-by-alice 2>/dev/null || echo no-write > ~/denied"}},
		{Type: "RUN", Args: []string{"mkdir -p /opt/rooted && echo root-step > /opt/rooted/x && rm -f /etc/motd", "root"}},
	}}
	before := e.sandboxesMade()
	res, l, err := e.build(spec, nil)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if made := e.sandboxesMade() - before; made != 5 {
		t.Errorf("the build made %d sandboxes, want 5 (one per RUN, WORKDIR and USER step)", made)
	}
	if !l.has("1|[builder 1/6] [stdout]: hello from the build") {
		t.Errorf("the RUN step's output is not in the log")
	}
	if res.Template != name || len(res.Cached) != 1 {
		t.Errorf("result %+v: want template %s and only the base cached", res, name)
	}
	out := e.run(name, "cat /home/user/first ~/env ~/cwd; cat ~/denied; id -un; pwd; cat /opt/rooted/x; test -e /etc/motd && echo motd-still-there; echo $GREETING", client.ExecOptions{})
	want := "built by user\nhi there\n/srv/app\nno-write\nalice\n/srv/app\nroot-step\nhi\n"
	if out.Stdout != want || out.ExitCode != 0 {
		t.Errorf("in a sandbox of the built template:\n%q (exit %d, %s)\nwant\n%q", out.Stdout, out.ExitCode, out.Stderr, want)
	}

	// A rebuild is served from the cache: no sandbox at all.
	before = e.sandboxesMade()
	res2, l2, err := e.build(spec, nil)
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if made := e.sandboxesMade() - before; made != 0 {
		t.Errorf("the cached rebuild made %d sandboxes", made)
	}
	if want := []string{"base", "1", "2", "3", "4", "5", "6"}; !slices.Equal(res2.Cached, want) {
		t.Errorf("cached steps %v, want %v", res2.Cached, want)
	}
	if !l2.has("5|CACHED [builder 5/6] RUN echo $BOTH") || res2.Digest != res.Digest {
		t.Errorf("rebuild: no CACHED line for step 5, or another image (%s, was %s)", res2.Digest, res.Digest)
	}

	// A forced step rebuilds itself and every step after it.
	spec.Steps[3].Force = true
	before = e.sandboxesMade()
	res3, _, err := e.build(spec, nil)
	if err != nil {
		t.Fatalf("forced rebuild: %v", err)
	}
	if want := []string{"base", "1", "2", "3"}; !slices.Equal(res3.Cached, want) {
		t.Errorf("cached steps after forcing step 4: %v, want %v", res3.Cached, want)
	}
	if made := e.sandboxesMade() - before; made != 3 {
		t.Errorf("forcing step 4 of 6 made %d sandboxes, want 3", made)
	}
}

// filesMap is Files from memory: the Dockerfile frontend's.
type filesMap = dockerfile.Archives

// tarOf makes an archive of entries (name → content; a name ending in /
// is a directory, "->target" content a symlink), gzipped if gz.
func tarOf(t *testing.T, gz bool, entries ...[2]string) []byte {
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, e := range entries {
		h := &tar.Header{Name: e[0], Mode: 0o644, Uid: 4242, Gid: 4242, ModTime: time.Unix(1e9, 0)}
		switch {
		case strings.HasSuffix(e[0], "/"):
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		case strings.HasPrefix(e[1], "->"):
			h.Typeflag, h.Linkname = tar.TypeSymlink, e[1][2:]
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e[1]))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e[1]))
		}
	}
	tw.Close()
	if zw != nil {
		zw.Close()
	}
	return buf.Bytes()
}

func hashOf(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func TestCopy(t *testing.T) {
	e := start(t, daemontest.Options{})
	app := tarOf(t, true, [2]string{"app/", ""}, [2]string{"app/config.json", `{"a":1}`}, [2]string{"app/server.py", "print(1)\n"})
	one := tarOf(t, false, [2]string{"one.txt", "secret\n"})
	files := filesMap{hashOf(app): app, hashOf(one): one}
	name := e.name()
	spec := build.Spec{Name: name, Base: build.Base{Template: "base"}, Steps: []build.Step{
		{Type: "COPY", Args: []string{"app", "/srv/app", "", ""}, FilesHash: hashOf(app)},
		{Type: "COPY", Args: []string{"one.txt", "/etc/one.conf", "root", "0600"}, FilesHash: hashOf(one)},
		{Type: "WORKDIR", Args: []string{"/opt/w"}},
		{Type: "ADD", Args: []string{"app/server.py", "bin/", "user:user", "0755"}, FilesHash: hashOf(app)},
	}}
	if _, _, err := e.build(spec, files); err != nil {
		t.Fatalf("build: %v", err)
	}
	out := e.run(name, "stat -c '%U:%G %a %n' /srv/app /srv/app/config.json /etc/one.conf /opt/w/bin/server.py; cat /srv/app/config.json; ls /tmp", client.ExecOptions{User: "root"})
	want := "user:user 755 /srv/app\nuser:user 644 /srv/app/config.json\nroot:root 600 /etc/one.conf\nuser:user 755 /opt/w/bin/server.py\n{\"a\":1}"
	if !strings.HasPrefix(out.Stdout, want) || strings.Contains(out.Stdout, "cella-copy") {
		t.Errorf("copied files:\n%s%s\nwant\n%s", out.Stdout, out.Stderr, want)
	}

	// An absolute name stays below the destination, as with tar.
	abs := tarOf(t, false, [2]string{"/etc/evil", "x"})
	absName := e.name()
	if _, _, err := e.build(build.Spec{Name: absName, Base: build.Base{Template: "base"}, Steps: []build.Step{
		{Type: "COPY", Args: []string{".", "/opt/x", "root", ""}, FilesHash: hashOf(abs)},
	}}, filesMap{hashOf(abs): abs}); err != nil {
		t.Fatalf("build: %v", err)
	}
	if out := e.run(absName, "cat /opt/x/etc/evil; test -e /etc/evil && echo escaped", client.ExecOptions{}); out.Stdout != "x" {
		t.Errorf("an absolute entry: %q, want it at /opt/x/etc/evil only", out.Stdout)
	}

	// Archives that try to write outside their directory are refused.
	for _, evil := range [][]byte{
		tarOf(t, false, [2]string{"../../../../etc/evil", "x"}),
		tarOf(t, true, [2]string{"link", "->/etc"}, [2]string{"link/evil", "x"}),
	} {
		spec := build.Spec{Name: e.name(), Base: build.Base{Template: "base"}, Steps: []build.Step{
			{Type: "RUN", Args: []string{"true"}},
			{Type: "COPY", Args: []string{".", "/", "root", ""}, FilesHash: hashOf(evil)},
		}}
		_, _, err := e.build(spec, filesMap{hashOf(evil): evil})
		step, msg, ok := build.FailedStep(err)
		if !ok || step != "2" || !strings.Contains(msg, "refused") {
			t.Errorf("an escaping archive: %v (step %q), want a refusal at step 2", err, step)
		}
		if _, err := e.Daemon.Templates.Get(spec.Name); err == nil {
			t.Errorf("a failed build left template %s", spec.Name)
		}
	}
}

func TestFailingStepLeavesNothing(t *testing.T) {
	e := start(t, daemontest.Options{})
	name := e.name()
	before := e.sandboxesMade()
	_, l, err := e.build(build.Spec{Name: name, Base: build.Base{Template: "base"}, Steps: []build.Step{
		{Type: "RUN", Args: []string{"echo one > ~/one"}},
		{Type: "RUN", Args: []string{"false"}},
		{Type: "RUN", Args: []string{"echo never"}},
	}}, nil)
	var se *build.StepError
	if !errors.As(err, &se) || se.Step != "2" || se.Message != "failed to run command 'false': exit status 1" {
		t.Fatalf("error %#v, want E2B's failure of step 2", err)
	}
	if !l.has("|Build failed: failed to run command 'false': exit status 1") {
		t.Errorf("no 'Build failed' line in the log")
	}
	if made := e.sandboxesMade() - before; made != 2 {
		t.Errorf("made %d sandboxes, want 2 (step 3 never runs)", made)
	}
	if _, err := e.Daemon.Templates.Get(name); err == nil {
		t.Errorf("the failed build named template %s", name)
	}
	if n := len(e.Daemon.Manager.List(tenant.System)); n != 0 {
		t.Errorf("%d sandboxes left after a failed build", n)
	}
	for _, d := range []string{"sandboxes", "snapshots"} {
		if ents, _ := os.ReadDir(filepath.Join(e.DataDir, d)); len(ents) != 0 {
			t.Errorf("%s left in %s after a failed build", ents[0].Name(), d)
		}
	}
	// Unknown types and a missing base are refused before anything runs.
	_, _, err = e.build(build.Spec{Name: name, Base: build.Base{Template: "base"}, Steps: []build.Step{{Type: "HEALTHCHECK", Args: []string{"x"}}}}, nil)
	if step, msg, _ := build.FailedStep(err); step != "1" || msg != "command type HEALTHCHECK is not implemented" {
		t.Errorf("unknown step type: %v", err)
	}
	_, _, err = e.build(build.Spec{Name: name, Base: build.Base{Template: "no-such-" + rnd()}}, nil)
	if step, _, _ := build.FailedStep(err); step != "base" {
		t.Errorf("missing base template: %v, want a base error", err)
	}
}

// get fetches path from port of sandbox id through the daemon's proxy
// (E2B's routing headers), once.
func (e *env) get(id string, port int, path string) (int, string, error) {
	req, _ := http.NewRequest("GET", e.URL+path, nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

func TestStartCommandSnapshot(t *testing.T) {
	e := start(t, daemontest.Options{})
	name := e.name()
	res, l, err := e.build(build.Spec{Name: name, Base: build.Base{Template: "base"},
		Steps: []build.Step{
			{Type: "RUN", Args: []string{"mkdir -p /srv/www && echo served-from-snapshot > /srv/www/index.html", "root"}},
		},
		StartCmd: "echo started >> ~/starts; exec python3 -m http.server 8000 --directory /srv/www",
		ReadyCmd: "curl -sf http://127.0.0.1:8000/ >/dev/null",
	}, nil)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if res.Snapshot == "" || !l.has("finalize|Template is ready") {
		t.Fatalf("no snapshot (%+v) or no ready line", res)
	}
	ctx := context.Background()
	for range 2 { // two sandboxes from one snapshot, each with its own server
		sb, err := e.Client.Create(ctx, client.CreateRequest{TemplateID: name})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		// The first request, with no wait: the server runs already.
		code, body, err := e.get(sb.SandboxID, 8000, "/")
		if err != nil || code != 200 || body != "served-from-snapshot\n" {
			t.Errorf("first request to port 8000: %d %q %v", code, body, err)
		}
		conn, err := e.Client.Sandbox(ctx, sb.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		out, err := conn.Exec(ctx, "cat ~/starts; pgrep -fc [h]ttp.server; id -un", client.ExecOptions{})
		if err != nil || out.Stdout != "started\n1\nuser\n" {
			t.Errorf("start command ran %q (%v), want once, still running, default user", out.Stdout, err)
		}
		info, err := e.Client.Get(ctx, sb.SandboxID)
		if err != nil || info.TemplateID != name {
			t.Errorf("info %+v %v: want template %s", info, err, name)
		}
		e.Client.Kill(ctx, sb.SandboxID)
	}
	// The hidden snapshot is no team's: not listed, not usable by ID.
	if _, err := e.Client.Create(ctx, client.CreateRequest{TemplateID: res.Snapshot}); err == nil {
		t.Errorf("created a sandbox from the template's snapshot by its ID")
	}
}

func TestReadyAndStartFailures(t *testing.T) {
	e := start(t, daemontest.Options{Build: daemon.BuildConfig{ReadyTimeout: 5 * time.Second}})
	name := e.name()
	_, _, err := e.build(build.Spec{Name: name, Base: build.Base{Template: "base"}, StartCmd: "sleep 1000", ReadyCmd: "echo not yet; false"}, nil)
	step, msg, _ := build.FailedStep(err)
	if step != "finalize" || !strings.Contains(msg, "ready command timed out after 5s") || !strings.Contains(msg, "not yet") {
		t.Errorf("a ready command that never succeeds: %v", err)
	}
	_, _, err = e.build(build.Spec{Name: name, Base: build.Base{Template: "base"}, StartCmd: "echo boom; exit 3", ReadyCmd: "false"}, nil)
	step, msg, _ = build.FailedStep(err)
	if step != "finalize" || !strings.HasPrefix(msg, "start command failed: failed to run command 'echo boom; exit 3': exit status 3") || !strings.Contains(msg, "boom") {
		t.Errorf("a start command that fails: %v", err)
	}
	if _, err := e.Daemon.Templates.Get(name); err == nil {
		t.Errorf("failed builds named template %s", name)
	}
	if n := len(e.Daemon.Manager.List(tenant.System)); n != 0 {
		t.Errorf("%d sandboxes left", n)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.DataDir, "snapshots")); len(ents) != 0 {
		t.Errorf("snapshot %s left by a failed build", ents[0].Name())
	}
}

// TestBuildStepCannotReachHost: a RUN step is untrusted code, as root in
// a sandbox: it sees none of the host's files, not the daemon's data dir
// or API, and has no egress unless the build policy gives it some.
func TestBuildStepCannotReachHost(t *testing.T) {
	secretDir := t.TempDir()
	secret := filepath.Join(secretDir, "host-secret-"+rnd())
	if err := os.WriteFile(secret, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := start(t, daemontest.Options{})
	port := strings.TrimPrefix(e.URL, "http://127.0.0.1:")
	probe := fmt.Sprintf(`r=""
test -e %[1]q && r="$r host-file"
test -e %[2]q && r="$r data-dir"
test -e %[3]q && r="$r cache-dir"
ls /run/cella 2>/dev/null | grep -qv agent.sock && r="$r run-dir:$(ls /run/cella)"
curl -sf -m 5 -o /dev/null http://127.0.0.1:%[4]s/health && r="$r daemon-api"
curl -sf -m 5 -o /dev/null http://10.0.0.1/ && r="$r lan"
curl -sf -m 5 -o /dev/null http://example.com/ && r="$r egress"
curl -sf -m 5 -o /dev/null http://169.254.169.254/ && r="$r metadata"
echo "reached:$r"
[ -z "$r" ]`, secret, filepath.Join(e.DataDir, "cella.db"), filepath.Join(daemontest.CacheDir(), "layers"), port)
	_, l, err := e.build(build.Spec{Name: e.name(), Base: build.Base{Template: "base"}, Steps: []build.Step{
		{Type: "RUN", Args: []string{probe, "root"}},
	}}, nil)
	if err != nil || !l.has("[stdout]: reached:") {
		t.Errorf("a build step reached the host: %v", err)
	}
}

// TestBuildEgressWithinKeyCeiling: a key whose own ceiling is narrower
// than the build policy gets no more egress in its build steps than in its
// sandboxes; a principal without one gets the build policy (the control).
func TestBuildEgressWithinKeyCeiling(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "reached "+r.Host) }))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	e := start(t, daemontest.Options{Network: daemon.NetworkConfig{
		Allow:   []string{"allowed.test", "other.test"},
		Resolve: []string{"allowed.test=" + addr, "other.test=" + addr},
	}})
	probe := fmt.Sprintf(`echo "allowed:$(curl -sf -m 10 http://allowed.test:%[1]d/)"; echo "other:$(curl -sf -m 10 http://other.test:%[1]d/)"`, port)
	spec := func() build.Spec {
		return build.Spec{Name: e.name(), Base: build.Base{Template: "base"}, Steps: []build.Step{{Type: "RUN", Args: []string{probe}}}}
	}
	e.team.Ceiling = &egress.Policy{AllowOut: []string{"allowed.test"}}
	_, l, err := e.build(spec(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !l.has(fmt.Sprintf("[stdout]: allowed:reached allowed.test:%d", port)) || !l.has("[stdout]: other:") || l.has("other:reached") {
		t.Errorf("a key limited to allowed.test reached: %q", l.messages())
	}
	e.team = tenant.Principal{Key: "k2-" + rnd(), Team: "team2-" + rnd()} // no ceiling of its own
	_, l, err = e.build(spec(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !l.has(fmt.Sprintf("[stdout]: other:reached other.test:%d", port)) {
		t.Errorf("the build policy (the daemon's ceiling) did not reach other.test: %q", l.messages())
	}
}

// TestTemplateSnapshotGoesWithTemplate: a rebuild replaces the snapshot,
// and a template removed without the daemon (cella template rm) loses its
// snapshot at the next build: no memory image is left behind.
func TestTemplateSnapshotGoesWithTemplate(t *testing.T) {
	e := start(t, daemontest.Options{Build: daemon.BuildConfig{ReadyTimeout: time.Minute}})
	snapshots := func() int {
		ents, _ := os.ReadDir(filepath.Join(e.DataDir, "snapshots"))
		return len(ents)
	}
	spec := func(name, marker string) build.Spec {
		return build.Spec{Name: name, Base: build.Base{Template: "base"}, StartCmd: "sleep 1000 # " + marker, ReadyCmd: "true"}
	}
	a, b := e.name(), e.name()
	r1, _, err := e.build(spec(a, "1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	r2, _, err := e.build(spec(a, "2"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Snapshot == r2.Snapshot || snapshots() != 1 {
		t.Errorf("after a rebuild: %d snapshots (%s, then %s), want the new one only", snapshots(), r1.Snapshot, r2.Snapshot)
	}
	if err := e.Daemon.Templates.Delete(a); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.build(spec(b, "3"), nil); err != nil {
		t.Fatal(err)
	}
	if n := snapshots(); n != 1 {
		t.Errorf("%d snapshots after the next build, want 1 (the removed template's pruned)", n)
	}
}

// TestBuildFromImage: a build on an image pulled from a real registry;
// a step that removes an image file makes an OCI whiteout, which the
// built template keeps, and which survives a push of the template and a
// pull of it back.
func TestBuildFromImage(t *testing.T) {
	e := start(t, daemontest.Options{})
	base, err := e.Daemon.Templates.Get("base")
	if err != nil {
		t.Fatal(err)
	}
	reg := registrytest.Start(t)
	small := registrytest.Layer(t, registrytest.TarOf(t, registrytest.File{Name: "srv", Dir: true},
		registrytest.File{Name: "srv/hello.py", Body: "print(6*7)\n"}, registrytest.File{Name: "srv/keep", Body: "k"}), registrytest.Gzip)
	reg.Push(t, "py:test", registrytest.Image(t, v1.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "IMAGE_VAR=from-image"}}, registrytest.DirLayer(t, base.RootFS), small))
	name := e.name()
	res, l, err := e.build(build.Spec{Name: name, Base: build.Base{Image: reg.Ref("py:test")}, Steps: []build.Step{
		{Type: "RUN", Args: []string{"rm /srv/hello.py && echo $IMAGE_VAR > /srv/made", "root"}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !l.has("base|[base] FROM " + reg.Ref("py:test")) {
		t.Errorf("no FROM line for the image")
	}
	check := func(tpl string) {
		out := e.run(tpl, "ls /srv; cat /srv/made", client.ExecOptions{})
		if out.Stdout != "keep\nmade\nfrom-image\n" {
			t.Errorf("template %s: %q %s, want hello.py gone and made written", tpl, out.Stdout, out.Stderr)
		}
	}
	check(name)
	// Export and import: the step's layer travels with its whiteout.
	ref, err := e.Daemon.Templates.Push(context.Background(), name, reg.Ref("built:1"), template.PullOptions{}, nil)
	if err != nil {
		t.Fatalf("push: %v", err)
	}
	back := e.name()
	if _, err := e.Daemon.Templates.Pull(context.Background(), back, ref, template.PullOptions{}); err != nil {
		t.Fatalf("pull back: %v", err)
	}
	check(back)
	if len(res.Layers) != 3 {
		t.Fatalf("layers %v: want the image's two and the step's", res.Layers)
	}
	// The image has no /etc/hosts: the build sandbox got cella's (it
	// resolves localhost), and the step's layer does not carry it.
	step, err := e.Daemon.Templates.Layers.Path(res.Layers[2])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(step, "etc/hosts")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the step's layer holds the /etc/hosts cella wrote for the build sandbox (%v)", err)
	}
	// A step's own /etc/hosts is the template's.
	own := e.name()
	if _, _, err := e.build(build.Spec{Name: own, Base: build.Base{Image: reg.Ref("py:test")}, Steps: []build.Step{
		{Type: "RUN", Args: []string{"getent hosts localhost && printf '10.1.2.3 step-own\\n' > /etc/hosts", "root"}},
	}}, nil); err != nil {
		t.Fatal(err)
	}
	if out := e.run(own, "cat /etc/hosts", client.ExecOptions{}); out.Stdout != "10.1.2.3 step-own\n" {
		t.Errorf("a step's own /etc/hosts: %q %s", out.Stdout, out.Stderr)
	}
}

// TestCaptureStartOfPulledBuild: a build with a start command, pushed and
// pulled back under another name (what a cluster node that lacks it
// does), carries its start and ready commands in the image; CaptureStart
// runs the start command once for that name's own snapshot, and a
// sandbox of it has the server up at its first request, as one of the
// build has.
func TestCaptureStartOfPulledBuild(t *testing.T) {
	e := start(t, daemontest.Options{})
	name := e.name()
	if _, _, err := e.build(build.Spec{Name: name, Base: build.Base{Template: "base"},
		Steps:    []build.Step{{Type: "RUN", Args: []string{"mkdir -p /srv/www && echo served-after-a-pull > /srv/www/index.html", "root"}}},
		StartCmd: "echo started >> ~/starts; exec python3 -m http.server 8000 --directory /srv/www",
		ReadyCmd: "curl -sf http://127.0.0.1:8000/ >/dev/null",
	}, nil); err != nil {
		t.Fatalf("build: %v", err)
	}
	reg := registrytest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ref, err := e.Daemon.Templates.Push(ctx, name, reg.Ref("started:1"), template.PullOptions{}, nil)
	if err != nil {
		t.Fatalf("push: %v", err)
	}
	back := e.name()
	pulled, err := e.Daemon.Templates.Pull(ctx, back, ref, template.PullOptions{})
	if err != nil {
		t.Fatalf("pull back: %v", err)
	}
	if pulled.Snapshot != "" || !strings.Contains(pulled.StartCmd, "http.server") || !strings.Contains(pulled.ReadyCmd, "curl") {
		t.Fatalf("pulled back: snapshot %q, start %q, ready %q; want the build's commands and no snapshot yet", pulled.Snapshot, pulled.StartCmd, pulled.ReadyCmd)
	}
	var starter build.Starter = e.Daemon.BuildEngine
	l := &logs{}
	if err := starter.CaptureStart(ctx, e.team, back, build.Sizes{}, l.add); err != nil {
		t.Fatalf("capture: %v\n%s", err, strings.Join(l.messages(), "\n"))
	}
	if tpl, err := e.Daemon.Templates.Get(back); err != nil || tpl.Snapshot == "" {
		t.Fatalf("after the capture %s names no snapshot: %+v %v", back, tpl, err)
	}
	sb, err := e.Client.Create(ctx, client.CreateRequest{TemplateID: back})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer e.Client.Kill(context.Background(), sb.SandboxID)
	// The first request, with no wait: the server runs already.
	if code, body, err := e.get(sb.SandboxID, 8000, "/"); err != nil || code != 200 || body != "served-after-a-pull\n" {
		t.Errorf("first request to port 8000 of the pulled template: %d %q %v", code, body, err)
	}
	conn, err := e.Client.Sandbox(ctx, sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := conn.Exec(ctx, "cat ~/starts; pgrep -fc [h]ttp.server", client.ExecOptions{}); err != nil || out.Stdout != "started\n1\n" {
		t.Errorf("the start command ran %q (%v); want once (the capture's), still running", out.Stdout, err)
	}
	// A template with neither command is left as it is.
	if err := starter.CaptureStart(ctx, e.team, "base", build.Sizes{}, nil); err != nil {
		t.Errorf("capture of base: %v", err)
	}
}
