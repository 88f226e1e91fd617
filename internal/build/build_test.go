package build_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
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

var _ = daemon.BuildConfig{}
