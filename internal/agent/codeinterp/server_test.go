package codeinterp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// These tests run the real drivers with the host's Debian python3 (with
// python3-ipython), node, esbuild and bash, found on the PATH a template
// has (not the test's own PATH, which may lead to a python without
// Debian's packages).
const testPATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func newTestServer(t *testing.T, mod func(*Config)) (*Server, string) {
	t.Helper()
	cfg := Config{
		Env: func() []string {
			return []string{"PATH=" + testPATH, "HOME=" + t.TempDir(), "LANG=C.UTF-8", "SANDBOX_VAR=from-sandbox"}
		},
		Workdir:           t.TempDir(),
		KeepaliveInterval: 300 * time.Millisecond,
		InterruptGrace:    3 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	s := New(cfg)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() { ts.Close(); s.Close() })
	return s, ts.URL
}

func needInterpreter(t *testing.T, name string) {
	t.Helper()
	if _, err := findExe([]string{name}, []string{"PATH=" + testPATH}); err != nil {
		t.Skipf("%s is not installed on this host: %v", name, err)
	}
}

// line is one NDJSON line of /execute, with when it arrived.
type line struct {
	m  map[string]any
	at time.Time
}

func (l line) typ() string { return l.m["type"].(string) }

type execResult struct {
	lines  []line
	start  time.Time
	status int
	body   string // non-200 body
}

func (r execResult) of(typ string) []line {
	var out []line
	for _, l := range r.lines {
		if l.typ() == typ {
			out = append(out, l)
		}
	}
	return out
}

// text is the main result's text, as execution.text in the SDK.
func (r execResult) text() (string, bool) {
	for _, l := range r.of("result") {
		if l.m["is_main_result"] == true {
			s, ok := l.m["text"].(string)
			return s, ok
		}
	}
	return "", false
}

func (r execResult) stdout() string {
	var b strings.Builder
	for _, l := range r.of("stdout") {
		b.WriteString(l.m["text"].(string))
	}
	return b.String()
}

func (r execResult) errorLine() map[string]any {
	if e := r.of("error"); len(e) > 0 {
		return e[len(e)-1].m
	}
	return nil
}

func execute(t *testing.T, ctx context.Context, url string, body map[string]any, headers ...string) (execResult, error) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/execute", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res := execResult{start: time.Now()}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		rb, _ := io.ReadAll(resp.Body)
		res.body = string(rb)
		return res, nil
	}
	if ct := resp.Header.Get("Content-Type"); !strings.Contains(ct, "ndjson") {
		t.Errorf("Content-Type = %q", ct)
	}
	r := bufio.NewReader(resp.Body)
	for {
		raw, err := r.ReadString('\n')
		if raw != "" {
			if strings.TrimSpace(raw) == "" {
				t.Errorf("blank NDJSON line (the SDK's JSON.parse throws on it)")
			} else {
				var m map[string]any
				if jerr := json.Unmarshal([]byte(raw), &m); jerr != nil {
					t.Fatalf("bad NDJSON line %q: %v", raw, jerr)
				}
				res.lines = append(res.lines, line{m: m, at: time.Now()})
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return res, nil
			}
			return res, err
		}
	}
}

func run(t *testing.T, url string, body map[string]any) execResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := execute(t, ctx, url, body)
	if err != nil {
		t.Fatalf("execute %v: %v", body, err)
	}
	if res.status != http.StatusOK {
		t.Fatalf("execute %v: status %d: %s", body, res.status, res.body)
	}
	if n := len(res.lines); n == 0 || res.lines[n-1].typ() != "end_of_execution" {
		t.Fatalf("execute %v: the stream does not end with end_of_execution: %v", body, res.lines)
	}
	return res
}

func py(code string) map[string]any { return map[string]any{"code": code} }

func wantText(t *testing.T, res execResult, want string) {
	t.Helper()
	if e := res.errorLine(); e != nil {
		t.Fatalf("unexpected error: %v", e)
	}
	got, ok := res.text()
	if !ok || got != want {
		t.Fatalf("main result text = %q (present %v), want %q; lines: %v", got, ok, want, res.lines)
	}
}

func doJSON(t *testing.T, method, url string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("%s %s: decode: %v", method, url, err)
		}
	}
	return resp.StatusCode
}

func TestHealth(t *testing.T) {
	_, url := newTestServer(t, nil)
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != `"OK"` {
		t.Fatalf("GET /health = %d %q", resp.StatusCode, b)
	}
}

func TestPythonBasics(t *testing.T) {
	needInterpreter(t, "python3")
	_, url := newTestServer(t, nil)

	res := run(t, url, py("1+1"))
	wantText(t, res, "2")
	if res.lines[0].typ() != "number_of_executions" || res.lines[0].m["execution_count"] != float64(1) {
		t.Fatalf("first line = %v, want number_of_executions 1", res.lines[0].m)
	}

	t.Run("state persists", func(t *testing.T) {
		run(t, url, py("x = 40\nimport math"))
		wantText(t, run(t, url, py("x + 2")), "42")
		wantText(t, run(t, url, py("math.floor(2.5)")), "2")
	})
	t.Run("string repr quotes are stripped", func(t *testing.T) {
		wantText(t, run(t, url, py("'abc'")), "abc")
	})
	t.Run("no result for None or a statement", func(t *testing.T) {
		for _, code := range []string{"None", "y = 1", "print('hi')"} {
			if r := run(t, url, py(code)); len(r.of("result")) != 0 {
				t.Errorf("%q gave results %v", code, r.of("result"))
			}
		}
	})
	t.Run("stdout and stderr", func(t *testing.T) {
		r := run(t, url, py("import sys, subprocess\nprint('out')\nprint('err', file=sys.stderr)\nsubprocess.run(['echo', 'child'])"))
		if got := r.stdout(); got != "out\nchild\n" {
			t.Errorf("stdout = %q", got)
		}
		if e := r.of("stderr"); len(e) != 1 || e[0].m["text"] != "err\n" {
			t.Errorf("stderr lines = %v", e)
		}
		for _, l := range r.of("stdout") {
			if _, err := time.Parse(time.RFC3339Nano, l.m["timestamp"].(string)); err != nil {
				t.Errorf("bad timestamp: %v", l.m)
			}
		}
	})
	t.Run("exception", func(t *testing.T) {
		r := run(t, url, py("def f():\n    return 1/0\nf()"))
		e := r.errorLine()
		if e == nil || e["name"] != "ZeroDivisionError" || e["value"] != "division by zero" {
			t.Fatalf("error = %v", e)
		}
		tb := e["traceback"].(string)
		if !strings.Contains(tb, "return 1/0") || strings.Contains(tb, "_execute") {
			t.Fatalf("traceback should show the cell's source and not the driver's frames:\n%s", tb)
		}
		wantText(t, run(t, url, py("x")), "40")
	})
	t.Run("syntax error", func(t *testing.T) {
		e := run(t, url, py("def (")).errorLine()
		if e == nil || e["name"] != "SyntaxError" {
			t.Fatalf("error = %v", e)
		}
	})
	t.Run("display protocol", func(t *testing.T) {
		r := run(t, url, py("class H:\n    def _repr_html_(self): return '<b>h</b>'\n    def __repr__(self): return 'H()'\ndisplay(H())\nH()"))
		rs := r.of("result")
		if len(rs) != 2 {
			t.Fatalf("results = %v", rs)
		}
		if rs[0].m["is_main_result"] != false || rs[0].m["html"] != "<b>h</b>" {
			t.Errorf("display() result = %v", rs[0].m)
		}
		if rs[1].m["is_main_result"] != true || rs[1].m["html"] != "<b>h</b>" || rs[1].m["text"] != "H()" {
			t.Errorf("main result = %v", rs[1].m)
		}
	})
	t.Run("top-level await", func(t *testing.T) {
		wantText(t, run(t, url, py("import asyncio\nawait asyncio.sleep(0.01)\n7")), "7")
	})
	t.Run("env vars", func(t *testing.T) {
		r := run(t, url, map[string]any{"code": "import os\nos.environ['REQ_VAR'] + ' ' + os.environ['SANDBOX_VAR']", "env_vars": map[string]string{"REQ_VAR": "from-request"}})
		wantText(t, r, "from-request from-sandbox")
		wantText(t, run(t, url, py("os.environ.get('REQ_VAR', 'unset')")), "unset")
	})
	t.Run("cwd", func(t *testing.T) {
		r := run(t, url, py("import os\nos.getcwd()"))
		if _, ok := r.text(); !ok {
			t.Fatalf("no cwd: %v", r.lines)
		}
	})
}

func TestPythonStreamsLive(t *testing.T) {
	needInterpreter(t, "python3")
	_, url := newTestServer(t, nil)
	// The cell sleeps 3 s between its prints; streamed output reaches the
	// client long before the end (half the sleep leaves room for a loaded
	// machine), buffered output only with it.
	r := run(t, url, py("import time\nprint('first', flush=True)\ntime.sleep(3)\nprint('second')"))
	outs := r.of("stdout")
	if len(outs) != 2 {
		t.Fatalf("stdout lines = %v", outs)
	}
	end := r.lines[len(r.lines)-1].at
	if gap := end.Sub(outs[0].at); gap < 1500*time.Millisecond {
		t.Fatalf("the first print arrived only %v before the end: not streamed", gap)
	}
	// 3 s of silence at a 300 ms interval.
	if n := len(r.of("keepalive")); n < 2 {
		t.Fatalf("keepalive lines = %d, want >= 2", n)
	}
}

func TestPythonInterruptOnDisconnect(t *testing.T) {
	needInterpreter(t, "python3")
	_, url := newTestServer(t, nil)
	run(t, url, py("kept = 'yes'"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err := execute(t, ctx, url, py("while True: pass"))
	if err == nil {
		t.Fatal("the runaway cell ended by itself")
	}
	// The next cell waits for the interrupt and runs in the same interpreter.
	wantText(t, run(t, url, py("kept")), "yes")
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the interrupt took %v", d)
	}
}

func TestPythonStuckInterpreterIsReplaced(t *testing.T) {
	needInterpreter(t, "python3")
	_, url := newTestServer(t, func(c *Config) { c.InterruptGrace = 500 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	// SIGINT is ignored: the driver must be killed and replaced.
	_, _ = execute(t, ctx, url, py("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.05)"))
	wantText(t, run(t, url, py("1+2")), "3")
}

func TestPythonInterpreterDeath(t *testing.T) {
	needInterpreter(t, "python3")
	_, url := newTestServer(t, nil)
	r := run(t, url, py("import os\nprint('bye', flush=True)\nos._exit(3)"))
	if e := r.errorLine(); e == nil || e["name"] != "InterpreterDied" || !strings.Contains(e["value"].(string), "exit status 3") {
		t.Fatalf("error = %v", e)
	}
	if r.stdout() != "bye\n" {
		t.Fatalf("stdout = %q", r.stdout())
	}
	wantText(t, run(t, url, py("2*3")), "6")
}

func TestContexts(t *testing.T) {
	needInterpreter(t, "python3")
	_, url := newTestServer(t, nil)
	var a, b contextInfo
	if st := doJSON(t, "POST", url+"/contexts", map[string]any{"language": "python"}, &a); st != 200 {
		t.Fatalf("create: %d", st)
	}
	if st := doJSON(t, "POST", url+"/contexts", map[string]any{}, &b); st != 200 {
		t.Fatalf("create: %d", st)
	}
	if a.ID == "" || a.ID == b.ID || a.Language != "python" || b.Language != "python" || a.Cwd == "" {
		t.Fatalf("contexts %+v %+v", a, b)
	}
	run(t, url, map[string]any{"code": "v = 'a'", "context_id": a.ID})
	run(t, url, map[string]any{"code": "v = 'b'", "context_id": b.ID})
	wantText(t, run(t, url, map[string]any{"code": "v", "context_id": a.ID}), "a")
	wantText(t, run(t, url, map[string]any{"code": "v", "context_id": b.ID}), "b")
	if e := run(t, url, py("v")).errorLine(); e == nil || e["name"] != "NameError" {
		t.Fatalf("the default context sees another context's variable: %v", e)
	}

	var list []contextInfo
	doJSON(t, "GET", url+"/contexts", nil, &list)
	langs := map[string]int{}
	for _, c := range list {
		langs[c.Language]++
	}
	// a, b and the default python context; the default javascript context
	// exists from the start too, as in E2B.
	if len(list) != 4 || langs["python"] != 3 || langs["javascript"] != 1 {
		t.Fatalf("list = %+v", list)
	}

	if st := doJSON(t, "POST", url+"/contexts/"+a.ID+"/restart", nil, nil); st != 200 {
		t.Fatalf("restart: %d", st)
	}
	if e := run(t, url, map[string]any{"code": "v", "context_id": a.ID}).errorLine(); e == nil || e["name"] != "NameError" {
		t.Fatalf("state survived a restart: %v", e)
	}
	if st := doJSON(t, "DELETE", url+"/contexts/"+a.ID, nil, nil); st != 200 {
		t.Fatalf("delete: %d", st)
	}
	if st := doJSON(t, "DELETE", url+"/contexts/"+a.ID, nil, nil); st != 404 {
		t.Fatalf("delete again: %d", st)
	}
	if st := doJSON(t, "POST", url+"/contexts/"+a.ID+"/restart", nil, nil); st != 404 {
		t.Fatalf("restart deleted: %d", st)
	}
	res, _ := execute(t, context.Background(), url, map[string]any{"code": "1", "context_id": a.ID})
	if res.status != 404 {
		t.Fatalf("execute in a deleted context: %d", res.status)
	}
	res, _ = execute(t, context.Background(), url, map[string]any{"code": "1", "context_id": b.ID, "language": "python"})
	if res.status != 400 {
		t.Fatalf("context_id and language: %d", res.status)
	}
	res, _ = execute(t, context.Background(), url, map[string]any{"code": "1", "language": "cobol"})
	if res.status != 400 || !strings.Contains(res.body, "not supported") {
		t.Fatalf("unknown language: %d %s", res.status, res.body)
	}
	if st := doJSON(t, "POST", url+"/contexts", map[string]any{"cwd": "/nonexistent/dir"}, nil); st != 400 {
		t.Fatalf("bad cwd: %d", st)
	}

	dir := t.TempDir()
	var c contextInfo
	doJSON(t, "POST", url+"/contexts", map[string]any{"cwd": dir}, &c)
	wantText(t, run(t, url, map[string]any{"code": "import os\nos.getcwd()", "context_id": c.ID}), dir)
}

func TestAccessToken(t *testing.T) {
	needInterpreter(t, "python3")
	_, url := newTestServer(t, func(c *Config) { c.AccessToken = func() string { return "secret" } })
	res, _ := execute(t, context.Background(), url, py("1"))
	if res.status != 401 {
		t.Fatalf("without token: %d", res.status)
	}
	res, err := execute(t, context.Background(), url, py("1"), "X-Access-Token", "secret")
	if err != nil || res.status != 200 {
		t.Fatalf("with token: %d %v", res.status, err)
	}
}

func TestJavaScript(t *testing.T) {
	needInterpreter(t, "node")
	_, url := newTestServer(t, nil)
	js := func(code string) map[string]any { return map[string]any{"code": code, "language": "javascript"} }
	run(t, url, js("let x = 41; var y = 1; globalThis.z = 0"))
	wantText(t, run(t, url, js("x + y + z")), "42")
	wantText(t, run(t, url, js("'str'")), "str")
	wantText(t, run(t, url, js("({a: 1})")), "{ a: 1 }")
	wantText(t, run(t, url, js("await Promise.resolve(5)")), "5")
	wantText(t, run(t, url, js("Promise.resolve(6)")), "6")
	wantText(t, run(t, url, js("require('path').join('a', 'b')")), "a/b")
	wantText(t, run(t, url, js("process.env.SANDBOX_VAR")), "from-sandbox")

	r := run(t, url, js("console.log('hello'); console.error('oops')"))
	if r.stdout() != "hello\n" || len(r.of("stderr")) != 1 {
		t.Fatalf("console: %v", r.lines)
	}
	e := run(t, url, js("null.boom")).errorLine()
	if e == nil || e["name"] != "TypeError" || !strings.Contains(e["traceback"].(string), "TypeError") {
		t.Fatalf("error = %v", e)
	}
	e = run(t, url, js("throw 'plain'")).errorLine()
	if e == nil || e["value"] != "'plain'" {
		t.Fatalf("error = %v", e)
	}

	// Streaming and interrupts.
	// The first line must arrive well before the end (half of a 3 s wait).
	r = run(t, url, js("console.log('first'); await new Promise(r => setTimeout(r, 3000)); console.log('second')"))
	if outs := r.of("stdout"); len(outs) != 2 || r.lines[len(r.lines)-1].at.Sub(outs[0].at) < 1500*time.Millisecond {
		t.Fatalf("not streamed: %v", r.lines)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := execute(t, ctx, url, js("while (true) {}")); err == nil {
		t.Fatal("the runaway cell ended by itself")
	}
	wantText(t, run(t, url, js("x")), "41")
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	_, _ = execute(t, ctx2, url, js("await new Promise(() => {})"))
	wantText(t, run(t, url, js("x + 1")), "42")
}

// The rich cases need numpy/pandas/matplotlib, which the
// code-interpreter-v1 template has; on a host without them they are
// skipped here and covered by compat/e2b/code-interpreter.test.mjs.
func needPythonModule(t *testing.T, mod string) {
	t.Helper()
	needInterpreter(t, "python3")
	exe, _ := findExe([]string{"python3"}, []string{"PATH=" + testPATH})
	if err := exec.Command(exe, "-c", "import "+mod).Run(); err != nil {
		t.Skipf("python3 on this host has no %s module (the code-interpreter-v1 template has it; the sandbox suite covers this case)", mod)
	}
}

func TestPythonPandas(t *testing.T) {
	needPythonModule(t, "pandas")
	_, url := newTestServer(t, nil)
	r := run(t, url, py("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})"))
	res := r.of("result")
	if len(res) != 1 || !strings.Contains(res[0].m["html"].(string), "<table") || !strings.Contains(res[0].m["text"].(string), "a  b") {
		t.Fatalf("results = %v", res)
	}
}

func TestPythonMatplotlib(t *testing.T) {
	needPythonModule(t, "matplotlib")
	_, url := newTestServer(t, nil)
	r := run(t, url, py("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"))
	var png string
	for _, l := range r.of("result") {
		if p, ok := l.m["png"].(string); ok {
			png = p
		}
	}
	if !strings.HasPrefix(png, "iVBORw0KGgo") {
		t.Fatalf("no PNG result: %v", r.lines)
	}
	if len(r.of("stderr")) != 0 {
		t.Fatalf("stderr: %v", r.of("stderr"))
	}
}
