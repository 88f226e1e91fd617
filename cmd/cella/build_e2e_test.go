package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCLIDockerfileBuild: `cella template build NAME -f Dockerfile
// --context DIR` through a daemon's build API and engine (gVisor): a
// multi-stage Dockerfile whose final stage copies from the first and from
// the context, with ENV, ARG, WORKDIR and USER; `cella run --template`
// sees all of it. A failing RUN and an unsupported instruction are errors
// that name the step and the line; a failed build's template starts no
// sandbox.
func TestCLIDockerfileBuild(t *testing.T) {
	d := startDaemon(t, t.TempDir(), freePort(t))
	dir := t.TempDir()
	write := func(name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("msg.txt", "from the context\n")
	df := write("Dockerfile", `FROM template:base AS builder
RUN mkdir -p /out && echo "built in stage one" > /out/artifact
FROM template:base
ARG FLAVOUR=plain
ENV GREETING="hello $FLAVOUR"
COPY --from=builder /out/artifact /app/artifact
COPY msg.txt /app/msg.txt
WORKDIR /app
RUN echo "step ran as $(id -un)" > /app/who
USER user
`)
	_, progress, code := d.cella("", "template", "build", "dfdemo", "-f", df, "--context", dir, "--build-arg", "FLAVOUR=spicy")
	if code != 0 {
		t.Fatalf("build: exit %d\n%s", code, progress)
	}
	t.Cleanup(func() { d.api(t, "DELETE", "/templates/dfdemo") })
	if list := d.api(t, "GET", "/templates"); !strings.Contains(list, `"dfdemo"`) {
		t.Fatalf("GET /templates does not list dfdemo: %s", list)
	}
	out := d.mustCella("run", "--template", "dfdemo", "--", "sh", "-c", "cat artifact msg.txt who; echo $GREETING; pwd; id -un")
	want := "built in stage one\nfrom the context\nstep ran as root\nhello spicy\n/app\nuser\n"
	if out != want {
		t.Fatalf("sandbox of the built template:\n%q\nwant\n%q\nbuild log:\n%s", out, want, progress)
	}

	// A rebuild is served from the cache.
	_, progress, code = d.cella("", "template", "build", "dfdemo", "-f", df, "--context", dir, "--build-arg", "FLAVOUR=spicy")
	if code != 0 || !strings.Contains(progress, "CACHED") {
		t.Fatalf("rebuild: exit %d, no CACHED step:\n%s", code, progress)
	}

	bad := write("Dockerfile.fail", "FROM template:base\nRUN echo one\nRUN false\n")
	_, errs, code := d.cella("", "template", "build", "dffail", "-f", bad, "--context", dir)
	if code == 0 || !strings.Contains(errs, "failed to run command 'false': exit status 1") {
		t.Fatalf("failing RUN: exit %d\n%s", code, errs)
	}
	unknown := write("Dockerfile.unknown", "FROM template:base\nRUN echo one\nHEALTHCHECK CMD true\n")
	_, errs, code = d.cella("", "template", "build", "dfunknown", "-f", unknown, "--context", dir)
	if code == 0 || !strings.Contains(errs, ":3:") || !strings.Contains(errs, "HEALTHCHECK") {
		t.Fatalf("unsupported instruction: exit %d\n%s", code, errs)
	}
	// As on E2B, a failed build is a template whose build is in error (its
	// log kept); no sandbox starts from it.
	t.Cleanup(func() { d.api(t, "DELETE", "/templates/dffail") })
	if st := d.api(t, "GET", "/templates/aliases/dffail"); !strings.Contains(st, `"templateID"`) {
		t.Fatalf("alias of the failed build: %s", st)
	}
	if _, errs, code := d.cella("", "run", "--template", "dffail", "--", "true"); code == 0 {
		t.Fatalf("a sandbox started from a failed build: %s", errs)
	}
	if list := d.api(t, "GET", "/templates"); strings.Contains(list, `"dfunknown"`) {
		t.Fatalf("a Dockerfile refused before any build made template dfunknown: %s", list)
	}
}

// api calls the daemon's REST API with the admin key and returns the body.
func (d *daemonProc) api(t *testing.T, method, path string) string {
	t.Helper()
	req, err := http.NewRequest(method, d.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", d.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	return string(b)
}
