package codeinterp

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// These cases hold the Python context to IPython's behaviour, as E2B's
// Jupyter kernels have it. They need python3-ipython on the host (the
// code-interpreter-v1 template has it).

func needIPython(t *testing.T) { t.Helper(); needPythonModule(t, "IPython") }

func results(r execResult) []map[string]any {
	var out []map[string]any
	for _, l := range r.of("result") {
		out = append(out, l.m)
	}
	return out
}

func TestIPythonShell(t *testing.T) {
	needIPython(t)
	_, url := newTestServer(t, nil)

	t.Run("indented cell is dedented", func(t *testing.T) {
		wantText(t, run(t, url, py("\n    a = 20\n    a * 2\n    ")), "40")
	})
	t.Run("shell escape", func(t *testing.T) {
		r := run(t, url, py("!echo from-shell; echo to-err >&2"))
		if r.stdout() != "from-shell\n" {
			t.Fatalf("stdout = %q: %v", r.stdout(), r.lines)
		}
		if e := r.of("stderr"); len(e) != 1 || e[0].m["text"] != "to-err\n" {
			t.Fatalf("stderr = %v", e)
		}
		wantText(t, run(t, url, py("files = !echo a; echo b\nfiles")), "['a', 'b']")
	})
	t.Run("magics", func(t *testing.T) {
		dir := t.TempDir()
		r := run(t, url, py("%cd "+dir))
		if e := r.errorLine(); e != nil {
			t.Fatalf("%%cd: %v", e)
		}
		wantText(t, run(t, url, py("import os\nos.getcwd()")), dir)
		if r := run(t, url, py("%%capture c\nprint('hidden')\n")); len(r.lines) != 2 {
			t.Fatalf("%%%%capture let output through: %v", r.lines)
		}
		wantText(t, run(t, url, py("c.stdout")), "hidden\\n")
		if r := run(t, url, py("%%bash\necho from-bash-magic")); r.stdout() != "from-bash-magic\n" {
			t.Fatalf("%%%%bash: %v", r.lines)
		}
		if r := run(t, url, py("%matplotlib inline")); r.errorLine() != nil {
			t.Fatalf("%%matplotlib inline: %v", r.errorLine())
		}
		if e := run(t, url, py("import sys\nsys.exit(3)")).errorLine(); e == nil || e["name"] != "SystemExit" || e["value"] != "3" {
			t.Fatalf("sys.exit: %v", e)
		}
		wantText(t, run(t, url, py("get_ipython().__class__.__name__")), "_Shell")
	})
	t.Run("IPython.display", func(t *testing.T) {
		r := run(t, url, py("from IPython.display import display, HTML, Markdown, JSON, Latex, Javascript, SVG\n"+
			"display(HTML('<b>x</b>'))\ndisplay(Markdown('# t'))\ndisplay(Latex(r'$x^2$'))\n"+
			"display(Javascript('alert(1)'))\ndisplay(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"/>'))\nJSON({'k': [1, 2]})"))
		rs := results(r)
		if len(rs) != 6 {
			t.Fatalf("results = %v (lines %v)", rs, r.lines)
		}
		for i, key := range []string{"html", "markdown", "latex", "javascript", "svg"} {
			if _, ok := rs[i][key]; !ok || rs[i]["is_main_result"] != false {
				t.Errorf("result %d has no %s: %v", i, key, rs[i])
			}
		}
		j, _ := json.Marshal(rs[5]["json"])
		if string(j) != `{"k":[1,2]}` || rs[5]["is_main_result"] != true {
			t.Errorf("JSON result = %v", rs[5])
		}
	})
	t.Run("strings unquoted", func(t *testing.T) {
		wantText(t, run(t, url, py(`"it's"`)), "it's")
		wantText(t, run(t, url, py(`'x'`)), "x")
	})
	t.Run("lists and dicts are JSON too", func(t *testing.T) {
		rs := results(run(t, url, py("{'a': [1, 2.5, None]}")))
		j, _ := json.Marshal(rs[0]["json"])
		if len(rs) != 1 || string(j) != `{"a":[1,2.5,null]}` || rs[0]["text"] != "{'a': [1, 2.5, None]}" {
			t.Fatalf("results = %v", rs)
		}
	})
	t.Run("error is E2B's ExecutionError", func(t *testing.T) {
		e := run(t, url, py("raise ValueError('bad value')")).errorLine()
		if e == nil || e["name"] != "ValueError" || e["value"] != "bad value" {
			t.Fatalf("error = %v", e)
		}
		tb := e["traceback"].(string)
		if !strings.Contains(tb, "ValueError: bad value") || !strings.Contains(tb, "raise ValueError") || strings.Contains(tb, "\x1b[") {
			t.Fatalf("traceback:\n%s", tb)
		}
	})
	t.Run("execution count", func(t *testing.T) {
		a := run(t, url, py("1")).lines[0].m["execution_count"].(float64)
		b := run(t, url, py("1")).lines[0].m["execution_count"].(float64)
		if b != a+1 {
			t.Fatalf("execution counts %v then %v", a, b)
		}
	})
}

func TestIPythonPILImage(t *testing.T) {
	needPythonModule(t, "PIL")
	needIPython(t)
	_, url := newTestServer(t, nil)
	r := run(t, url, py("from PIL import Image\nimg = Image.new('RGB', (4, 4), 'red')\nimg.save('red.png')\nimg.show()"))
	rs := results(r) // save() and show() each display it
	if len(rs) != 2 {
		t.Fatalf("results = %v (lines %v)", rs, r.lines)
	}
	for _, res := range rs {
		if !strings.HasPrefix(res["png"].(string), "iVBORw0KGgo") || res["is_main_result"] != false {
			t.Fatalf("result = %v", res)
		}
	}
	wantText(t, run(t, url, py("import os\nos.path.getsize('red.png') > 0")), "True")
}

func TestIPythonDataFrame(t *testing.T) {
	needPythonModule(t, "pandas")
	needIPython(t)
	_, url := newTestServer(t, nil)
	rs := results(run(t, url, py("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', None], 't': pd.to_datetime(['2024-01-02', '2024-01-03'])})")))
	if len(rs) != 1 {
		t.Fatalf("results = %v", rs)
	}
	d, _ := json.Marshal(rs[0]["data"])
	if string(d) != `{"a":[1,2],"b":["x",null],"t":["2024-01-02T00:00:00","2024-01-03T00:00:00"]}` {
		t.Fatalf("e2b/data = %s", d)
	}
	if !strings.Contains(rs[0]["html"].(string), "<table") {
		t.Fatalf("no html: %v", rs[0])
	}
}

// chart runs code and returns the chart of its only result.
func chart(t *testing.T, url, code string) map[string]any {
	t.Helper()
	r := run(t, url, py(code))
	rs := results(r)
	if len(rs) != 1 {
		t.Fatalf("results = %v (lines %v)", rs, r.lines)
	}
	if !strings.HasPrefix(rs[0]["png"].(string), "iVBORw0KGgo") || !strings.HasPrefix(rs[0]["text"].(string), "<Figure size") {
		t.Fatalf("figure result = %v", rs[0])
	}
	if extra := rs[0]["extra"].(map[string]any); len(extra) != 0 {
		t.Fatalf("extra = %v", extra)
	}
	c, ok := rs[0]["chart"].(map[string]any)
	if !ok {
		t.Fatalf("no chart: %v", rs[0])
	}
	return c
}

func jsonOf(v any) string { b, _ := json.Marshal(v); return string(b) }

func TestIPythonCharts(t *testing.T) {
	needPythonModule(t, "matplotlib")
	needIPython(t)
	_, url := newTestServer(t, nil)
	run(t, url, py("import matplotlib.pyplot as plt\nimport datetime"))

	t.Run("line", func(t *testing.T) {
		c := chart(t, url, "plt.plot([datetime.date(2023, 9, d) for d in (1, 2, 3)], [1, 4, 9], label='sq')\n"+
			"plt.xlabel('Time (s)')\nplt.ylabel('Amplitude [Hz]')\nplt.title('T')\nplt.show()")
		if c["type"] != "line" || c["title"] != "T" || c["x_unit"] != "s" || c["y_unit"] != "Hz" || c["x_scale"] != "datetime" || c["y_scale"] != "linear" {
			t.Fatalf("chart = %v", c)
		}
		if got := jsonOf(c["elements"]); got != `[{"label":"sq","points":[["2023-09-01",1],["2023-09-02",4],["2023-09-03",9]]}]` {
			t.Fatalf("elements = %s", got)
		}
		if ticks := c["x_ticks"].([]any); len(ticks) == 0 || !strings.HasPrefix(ticks[0].(string), "2023-") {
			t.Fatalf("x_ticks = %v", ticks)
		}
	})
	t.Run("bar", func(t *testing.T) {
		c := chart(t, url, "plt.bar(['A', 'B', 'C'], [1, 2, 3], label='sold')\nplt.xlabel('who')\nplt.show()")
		if c["type"] != "bar" || c["x_label"] != "who" || c["y_label"] != nil || c["title"] != nil {
			t.Fatalf("chart = %v", c)
		}
		if got := jsonOf(c["elements"]); got != `[{"group":"sold","label":"A","value":1},{"group":"sold","label":"B","value":2},{"group":"sold","label":"C","value":3}]` {
			t.Fatalf("elements = %s", got)
		}
	})
	t.Run("scatter", func(t *testing.T) {
		c := chart(t, url, "plt.scatter([1, 2], [3, 4], label='d1')\nplt.scatter([5], [6], label='d2')\nplt.show()")
		if c["type"] != "scatter" || c["x_scale"] != "linear" {
			t.Fatalf("chart = %v", c)
		}
		if got := jsonOf(c["elements"]); got != `[{"label":"d1","points":[[1,3],[2,4]]},{"label":"d2","points":[[5,6]]}]` {
			t.Fatalf("elements = %s", got)
		}
	})
	t.Run("pie", func(t *testing.T) {
		c := chart(t, url, "fig, ax = plt.subplots()\nax.pie([90, 10], labels=['No', 'Yes'], autopct='%1.1f%%', startangle=90)\nplt.title('P')\nplt.show()")
		if c["type"] != "pie" || c["title"] != "P" {
			t.Fatalf("chart = %v", c)
		}
		if got := jsonOf(c["elements"]); got != `[{"angle":324,"label":"No","radius":1},{"angle":36,"label":"Yes","radius":1}]` {
			t.Fatalf("elements = %s", got)
		}
	})
	t.Run("box and whisker", func(t *testing.T) {
		// E2B's own test data.
		c := chart(t, url, "data = {'Class A': [85, 90, 78, 92, 88], 'Class B': [95, 89, 76, 91, 84, 87], 'Class C': [75, 82, 88, 79, 86]}\n"+
			"fig, ax = plt.subplots()\nax.set_title('Exam')\nax.set_xlabel('Class')\nax.set_ylabel('Score')\n"+
			"ax.boxplot(data.values(), labels=data.keys(), patch_artist=True)\nplt.show()")
		if c["type"] != "box_and_whisker" || c["x_label"] != "Class" || c["y_label"] != "Score" {
			t.Fatalf("chart = %v", c)
		}
		want := `[{"first_quartile":85,"label":"Class A","max":92,"median":88,"min":78,"outliers":[],"third_quartile":90},` +
			`{"first_quartile":84.75,"label":"Class B","max":95,"median":88,"min":84,"outliers":[76],"third_quartile":90.5},` +
			`{"first_quartile":79,"label":"Class C","max":88,"median":82,"min":75,"outliers":[],"third_quartile":86}]`
		if got := jsonOf(c["elements"]); got != want {
			t.Fatalf("elements = %s\nwant       %s", got, want)
		}
	})
	t.Run("scales", func(t *testing.T) {
		// E2B's charts/log and charts/scales cases.
		c := chart(t, url, "import numpy as np\nx = np.linspace(0, 100, 100)\nplt.plot(x, np.exp(x), label='y = e^x')\nplt.yscale('log')\n"+
			"plt.ylabel('Y-axis (log scale)')\nplt.legend()\nplt.grid(True)\nplt.show()")
		if c["type"] != "line" || c["x_scale"] != "linear" || c["y_scale"] != "log" || c["y_unit"] != "log scale" || len(c["elements"].([]any)) != 1 {
			t.Fatalf("log chart = %v", c)
		}
		c = chart(t, url, "plt.plot([1, 2, 3], ['A', 'B', 'C'])\nplt.show()")
		if c["x_scale"] != "linear" || c["y_scale"] != "categorical" || jsonOf(c["elements"]) != `[{"label":"Line 0","points":[[1,"A"],[2,"B"],[3,"C"]]}]` {
			t.Fatalf("categorical chart = %v", c)
		}
	})
	t.Run("horizontal bars", func(t *testing.T) {
		c := chart(t, url, "plt.barh(['A', 'B'], [3, 5], label='n')\nplt.xlabel('count')\nplt.ylabel('who')\nplt.show()")
		// Measured along x: the labels swap, as E2B's extractor does.
		if c["type"] != "bar" || c["x_label"] != "who" || c["y_label"] != "count" ||
			jsonOf(c["elements"]) != `[{"group":"n","label":"A","value":3},{"group":"n","label":"B","value":5}]` {
			t.Fatalf("chart = %v", c)
		}
	})
	t.Run("superchart", func(t *testing.T) {
		c := chart(t, url, "fig, (a, b) = plt.subplots(1, 2)\nfig.suptitle('S')\na.plot([1, 2])\nb.bar(['x', 'y'], [1, 2])\nplt.show()")
		els := c["elements"].([]any)
		if c["type"] != "superchart" || c["title"] != "S" || len(els) != 2 || els[0].(map[string]any)["type"] != "line" || els[1].(map[string]any)["type"] != "bar" {
			t.Fatalf("chart = %v", c)
		}
	})
	t.Run("figure drawn without show", func(t *testing.T) {
		// The cell's value (the lines) is the main result; the figure is
		// displayed when the cell ends, as the inline backend does.
		c := chart(t, url, "plt.plot([1, 2, 3]);")
		if c["type"] != "line" || jsonOf(c["elements"]) != `[{"label":"Line 0","points":[[0,1],[1,2],[2,3]]}]` {
			t.Fatalf("chart = %v", c)
		}
	})
}

func TestBash(t *testing.T) {
	needInterpreter(t, "bash")
	_, url := newTestServer(t, nil)
	sh := func(code string) map[string]any { return map[string]any{"code": code, "language": "bash"} }
	dir := t.TempDir()
	r := run(t, url, sh("X=41; cd "+dir+"; f() { echo \"f$1\"; }"))
	if e := r.errorLine(); e != nil {
		t.Fatalf("error = %v", e)
	}
	r = run(t, url, sh("echo $((X+1)); pwd; f 1; echo oops >&2"))
	if r.stdout() != "42\n"+dir+"\nf1\n" || len(r.of("stderr")) != 1 {
		t.Fatalf("lines = %v", r.lines)
	}
	e := run(t, url, sh("false")).errorLine()
	if e == nil || e["value"] != "1" {
		t.Fatalf("false: error = %v", e)
	}
	r = run(t, url, map[string]any{"code": "echo \"$REQ_VAR/$SANDBOX_VAR\"", "language": "bash", "env_vars": map[string]string{"REQ_VAR": "it's"}})
	if r.stdout() != "it's/from-sandbox\n" {
		t.Fatalf("env vars: %v", r.lines)
	}
	if r := run(t, url, sh("echo \"[${REQ_VAR-unset}]\"")); r.stdout() != "[unset]\n" {
		t.Fatalf("env var not reset: %v", r.lines)
	}
	// Env vars are data, never script: neither a value nor a name runs.
	marker := filepath.Join(dir, "injected")
	r = run(t, url, map[string]any{"code": "printf '%s' \"$V\"", "language": "bash", "env_vars": map[string]string{
		"V": "'; touch " + marker + "; '$(touch " + marker + ")`touch " + marker + "`", "X;touch " + marker: "1", "$(touch " + marker + ")": "1",
	}})
	if r.stdout() != "'; touch "+marker+"; '$(touch "+marker+")`touch "+marker+"`" {
		t.Fatalf("value = %q", r.stdout())
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("an env var's name or value ran as a command")
	}
}

func TestTypeScript(t *testing.T) {
	needInterpreter(t, "node")
	needInterpreter(t, "esbuild")
	_, url := newTestServer(t, nil)
	ts := func(code string) map[string]any { return map[string]any{"code": code, "language": "ts"} }
	run(t, url, ts("interface P { n: number }\nconst p: P = { n: 41 }\nfunction inc(x: number): number { return x + 1 }"))
	wantText(t, run(t, url, ts("inc(p.n) as number")), "42")
	wantText(t, run(t, url, ts("const s: string = await Promise.resolve('ok')\ns")), "ok")
	e := run(t, url, ts("let q: = 1")).errorLine()
	if e == nil || e["name"] != "SyntaxError" {
		t.Fatalf("error = %v", e)
	}
}

func TestRefusals(t *testing.T) {
	_, url := newTestServer(t, nil)
	var body struct{ Message string }
	if code := doJSONBody(t, "POST", url+"/contexts", map[string]any{"language": "cobol"}, &body); code != http.StatusBadRequest ||
		!strings.Contains(body.Message, "bash, javascript, python, r, typescript") {
		t.Fatalf("unknown language: %d %q", code, body.Message)
	}
	res, _ := execute(t, t.Context(), url, map[string]any{"code": "1", "language": "cobol"})
	if res.status != http.StatusBadRequest || !strings.Contains(res.body, "supported:") {
		t.Fatalf("execute unknown language: %d %s", res.status, res.body)
	}
	missing := filepath.Join(t.TempDir(), "nope")
	if code := doJSONBody(t, "POST", url+"/contexts", map[string]any{"cwd": missing}, &body); code != http.StatusBadRequest || !strings.Contains(body.Message, "no such file") {
		t.Fatalf("missing cwd: %d %q", code, body.Message)
	}
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, nil, 0o644)
	if code := doJSONBody(t, "POST", url+"/contexts", map[string]any{"cwd": file}, &body); code != http.StatusBadRequest || !strings.Contains(body.Message, "not a directory") {
		t.Fatalf("file cwd: %d %q", code, body.Message)
	}
}

// doJSONBody is doJSON that decodes error bodies too.
func doJSONBody(t *testing.T, method, url string, body any, out any) int {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, url, strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("%s %s: decode: %v", method, url, err)
	}
	return resp.StatusCode
}

func TestDefaultContextsAtBoot(t *testing.T) {
	_, url := newTestServer(t, nil)
	var list []contextInfo
	doJSON(t, "GET", url+"/contexts", nil, &list)
	if len(list) != 2 {
		t.Fatalf("contexts before any cell = %+v, want the python and javascript defaults", list)
	}
	for _, c := range list {
		if c.Language != "python" && c.Language != "javascript" {
			t.Fatalf("contexts = %+v", list)
		}
	}
}

func TestR(t *testing.T) {
	needInterpreter(t, "Rscript")
	_, url := newTestServer(t, nil)
	r := func(code string) map[string]any { return map[string]any{"code": code, "language": "r"} }
	run(t, url, r("x <- 41"))
	wantText(t, run(t, url, r("x + 1")), "[1] 42")
	wantText(t, run(t, url, r("getwd()")), `[1] "`+mustGetwd(t, url)+`"`)
	res := run(t, url, r("cat('out\\n'); message('note'); data.frame(a = 1:2)"))
	if res.stdout() != "out\n" || len(res.of("stderr")) != 1 {
		t.Fatalf("lines = %v", res.lines)
	}
	rs := results(res)
	if len(rs) != 1 || !strings.Contains(rs[0]["html"].(string), "<table") {
		t.Fatalf("data.frame results = %v", rs)
	}
	e := run(t, url, r("stop('bad thing')")).errorLine()
	if e == nil || e["value"] != "bad thing" || !strings.Contains(e["traceback"].(string), "bad thing") {
		t.Fatalf("error = %v", e)
	}
	rs = results(run(t, url, r("plot(1:3)")))
	if len(rs) != 1 || !strings.HasPrefix(rs[0]["png"].(string), "iVBORw0KGgo") {
		t.Fatalf("plot results = %v", rs)
	}
	res = run(t, url, map[string]any{"code": "Sys.getenv('REQ_VAR')", "language": "r", "env_vars": map[string]string{"REQ_VAR": "v"}})
	wantText(t, res, `[1] "v"`)
	wantText(t, run(t, url, r("Sys.getenv('REQ_VAR', 'unset')")), `[1] "unset"`)
}

// mustGetwd is the default working directory of the test server's contexts.
func mustGetwd(t *testing.T, url string) string {
	t.Helper()
	var list []contextInfo
	doJSON(t, "GET", url+"/contexts", nil, &list)
	return list[0].Cwd
}

// TestAsUnprivilegedUser runs every driver as nobody, as the agent runs
// them as the sandbox user: pipes the agent (root) made, a home of the
// user's own, a cwd it may not enter.
func TestAsUnprivilegedUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the drivers as another user")
	}
	const nobody = 65534
	home, err := os.MkdirTemp("", "cella-ci-home-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	if err := os.Chmod(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	_, url := newTestServer(t, func(c *Config) {
		c.Workdir = home
		c.Env = func() []string { return []string{"PATH=" + testPATH, "HOME=" + home, "LANG=C.UTF-8"} }
		c.Spawn = func(p Proc) (int, <-chan unix.WaitStatus, error) {
			return localSpawn(p, &syscall.Credential{Uid: nobody, Gid: nobody})
		}
	})
	for _, tc := range []struct{ lang, code, want, needs string }{
		{"python", "import os\n!echo $HOME\nos.getuid()", "65534", "python3"},
		{"javascript", "process.getuid()", "65534", "node"},
		{"typescript", "(process.getuid() as number)", "65534", "esbuild"},
		{"r", "Sys.getenv('HOME')", `[1] "` + home + `"`, "Rscript"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			needInterpreter(t, tc.needs)
			if tc.lang == "python" {
				needIPython(t)
			}
			r := run(t, url, map[string]any{"code": tc.code, "language": tc.lang})
			wantText(t, r, tc.want)
			if e := r.of("stderr"); len(e) != 0 {
				t.Fatalf("stderr: %v", e)
			}
		})
	}
	t.Run("bash", func(t *testing.T) {
		if r := run(t, url, map[string]any{"code": "id -u", "language": "bash"}); r.stdout() != "65534\n" {
			t.Fatalf("lines = %v", r.lines)
		}
	})
	t.Run("cwd the user cannot enter", func(t *testing.T) {
		needIPython(t)
		private := t.TempDir() // root's, 0700
		var body struct{ Message string }
		code := doJSONBody(t, "POST", url+"/contexts", map[string]any{"cwd": private}, &body)
		if code != http.StatusBadRequest || !strings.Contains(body.Message, private) || !strings.Contains(body.Message, "may not enter") {
			t.Fatalf("create in %s: %d %q", private, code, body.Message)
		}
	})
}

// cancelled runs code with a client that goes away after a second, as the
// SDK's timeoutMs does.
func cancelled(t *testing.T, url string, body map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := execute(t, ctx, url, body); err == nil {
		t.Fatalf("%v ended by itself", body)
	}
}

// TestInterruptKeepsState: an interrupted cell leaves the context's state,
// in a shell command, in R and in bash.
func TestInterruptKeepsState(t *testing.T) {
	_, url := newTestServer(t, nil)
	t.Run("python !cmd", func(t *testing.T) {
		needIPython(t)
		run(t, url, py("kept = 'yes'"))
		cancelled(t, url, py("!sleep 30"))
		wantText(t, run(t, url, py("kept")), "yes")
	})
	t.Run("r", func(t *testing.T) {
		needInterpreter(t, "Rscript")
		r := func(code string) map[string]any { return map[string]any{"code": code, "language": "r"} }
		run(t, url, r("kept <- 'yes'"))
		cancelled(t, url, r("Sys.sleep(30)"))
		wantText(t, run(t, url, r("kept")), `[1] "yes"`)
	})
	t.Run("bash", func(t *testing.T) {
		sh := func(code string) map[string]any { return map[string]any{"code": code, "language": "bash"} }
		run(t, url, sh("kept=yes"))
		cancelled(t, url, sh("sleep 30; echo not-reached"))
		cancelled(t, url, sh("while true; do sleep 1; done"))
		if r := run(t, url, sh("echo $kept")); r.stdout() != "yes\n" {
			t.Fatalf("lines = %v", r.lines)
		}
	})
}

// TestWarm: the python context's interpreter starts before any cell, and
// its first cell sees the env vars the sandbox got after that start.
func TestWarm(t *testing.T) {
	needIPython(t)
	var (
		mu     sync.Mutex
		spawns int
		late   string
	)
	s, url := newTestServer(t, func(c *Config) {
		c.Env = func() []string {
			mu.Lock()
			defer mu.Unlock()
			env := []string{"PATH=" + testPATH, "HOME=" + c.Workdir, "LANG=C.UTF-8"}
			if late != "" {
				env = append(env, "LATE_VAR="+late)
			}
			return env
		}
		c.Spawn = func(p Proc) (int, <-chan unix.WaitStatus, error) {
			mu.Lock()
			spawns++
			mu.Unlock()
			return LocalSpawner(p)
		}
	})
	s.Warm(t.Context())
	deadline := time.Now().Add(60 * time.Second)
	s.mu.Lock()
	k := s.defaults["python"]
	s.mu.Unlock()
	for {
		k.mu.Lock()
		up := k.drv != nil
		k.mu.Unlock()
		if up {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the python interpreter did not start before any cell")
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	late = "set-after-start" // as the daemon's /init does after boot
	mu.Unlock()
	wantText(t, run(t, url, py("import os\nos.environ.get('LATE_VAR', 'missing')")), "set-after-start")
	wantText(t, run(t, url, py("os.environ.get('LATE_VAR', 'missing')")), "set-after-start")
	mu.Lock()
	defer mu.Unlock()
	if spawns != 1 {
		t.Fatalf("%d interpreters started, want the warm one only", spawns)
	}
}
