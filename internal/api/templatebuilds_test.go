package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// scriptedBuilder is a test double of the build engine (the real one is
// internal/build, which the E2B compat suite drives): each RUN step's
// command is a script word — "lines N" sends N log lines, "fail" fails the
// step, "wait" blocks until release is closed or the daemon stops — so the
// routes' status, paging, tenancy and restart logic is tested without a
// build sandbox.
type scriptedBuilder struct {
	release chan struct{}
	waiting chan struct{} // closed when a "wait" step is reached

	mu     sync.Mutex
	specs  []build.Spec
	actors []tenant.Principal
}

func newScripted() *scriptedBuilder {
	return &scriptedBuilder{release: make(chan struct{}), waiting: make(chan struct{})}
}

func (b *scriptedBuilder) Build(ctx context.Context, p tenant.Principal, spec build.Spec, files build.Files, log func(build.LogEntry)) (build.Result, error) {
	b.mu.Lock()
	b.specs = append(b.specs, spec)
	b.actors = append(b.actors, p)
	b.mu.Unlock()
	// The first and last lines are the engine's, as internal/build logs them.
	log(build.LogEntry{Level: build.LevelInfo, Message: "Building template " + spec.Name})
	log(build.LogEntry{Level: build.LevelInfo, Step: "base", Message: "[base] FROM " + spec.Base.Image + spec.Base.Template})
	for i, st := range spec.Steps {
		n := strconv.Itoa(i + 1)
		if st.Type != build.StepRun {
			continue
		}
		word, arg, _ := strings.Cut(st.Args[0], " ")
		switch word {
		case "lines":
			k, _ := strconv.Atoi(arg)
			for j := range k {
				log(build.LogEntry{Level: build.LevelInfo, Step: n, Message: fmt.Sprintf("line %d", j)})
			}
		case "fail":
			log(build.LogEntry{Level: build.LevelError, Step: n, Message: "[stderr]: it failed"})
			log(build.LogEntry{Level: build.LevelError, Message: "Build failed: failed to run command 'fail': exit status 1"})
			return build.Result{}, &build.StepError{Step: n, Message: "failed to run command 'fail': exit status 1"}
		case "wait":
			close(b.waiting)
			select {
			case <-b.release:
			case <-ctx.Done():
				return build.Result{}, ctx.Err()
			}
		}
	}
	log(build.LogEntry{Level: build.LevelInfo, Message: "Build finished, took 0s"})
	return build.Result{Template: spec.Name}, nil
}

func (b *scriptedBuilder) lastSpec() build.Spec {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.specs[len(b.specs)-1]
}

type buildStatus struct {
	TemplateID string `json:"templateID"`
	BuildID    string `json:"buildID"`
	Status     string `json:"status"`
	LogEntries []struct {
		Timestamp time.Time `json:"timestamp"`
		Level     string    `json:"level"`
		Message   string    `json:"message"`
		Step      string    `json:"step"`
	} `json:"logEntries"`
	Logs   []string `json:"logs"`
	Reason *struct {
		Message    string            `json:"message"`
		Step       string            `json:"step"`
		LogEntries []json.RawMessage `json:"logEntries"`
	} `json:"reason"`
}

type requested struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Names      []string `json:"names"`
	Aliases    []string `json:"aliases"`
	Tags       []string `json:"tags"`
	Public     bool     `json:"public"`
}

// e2bT drives the build routes as E2B's SDK does.
type e2bT struct {
	apiT
	t *testing.T
}

func (e e2bT) json(method, path, key string, body any, want int, out any) []byte {
	e.t.Helper()
	st, _, b := e.do(e.t, method, path, key, body, nil)
	if st != want {
		e.t.Fatalf("%s %s: %d %s, want %d", method, path, st, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			e.t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return b
}

func (e e2bT) request(key, name string, tags ...string) requested {
	e.t.Helper()
	var r requested
	body := map[string]any{"name": name, "cpuCount": 2, "memoryMB": 1024}
	if len(tags) > 0 {
		body["tags"] = tags
	}
	e.json("POST", "/v3/templates", key, body, 202, &r)
	return r
}

func (e e2bT) trigger(key string, r requested, body any) {
	e.t.Helper()
	e.json("POST", "/v2/templates/"+r.TemplateID+"/builds/"+r.BuildID, key, body, 202, nil)
}

func (e e2bT) status(key string, r requested, offset int) buildStatus {
	e.t.Helper()
	var s buildStatus
	e.json("GET", fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d", r.TemplateID, r.BuildID, offset), key, nil, 200, &s)
	return s
}

// wait polls like the SDK until the build ends and a page is empty, and
// returns the final status with every log entry it collected.
func (e e2bT) wait(key string, r requested) (buildStatus, []string) {
	e.t.Helper()
	var lines []string
	deadline := time.Now().Add(2 * time.Minute)
	for offset := 0; ; {
		s := e.status(key, r, offset)
		if len(s.LogEntries) > 100 {
			e.t.Fatalf("a page of %d entries (at most 100)", len(s.LogEntries))
		}
		for _, l := range s.LogEntries {
			lines = append(lines, l.Message)
		}
		offset += len(s.LogEntries)
		if (s.Status == "ready" || s.Status == "error") && len(s.LogEntries) == 0 {
			return s, lines
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("build %s still %s after 2 minutes", r.BuildID, s.Status)
		}
		if s.Status == "building" || s.Status == "waiting" {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func steps(cmds ...string) []map[string]any {
	out := []map[string]any{}
	for _, c := range cmds {
		out = append(out, map[string]any{"type": "RUN", "args": []string{c}, "force": false})
	}
	return out
}

// upload asks for the files link of hash and PUTs data to it.
func (e e2bT) upload(key string, r requested, hash, data string) (present bool) {
	e.t.Helper()
	var link struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	e.json("GET", "/templates/"+r.TemplateID+"/files/"+hash, key, nil, 201, &link)
	if st, body := putURL(e.t, link.URL, data); st != 200 {
		e.t.Fatalf("PUT %s: %d %s", link.URL, st, body)
	}
	return link.Present
}

func putURL(t *testing.T, u, data string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("PUT", u, strings.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	n, _ := resp.Body.Read(buf)
	b.Write(buf[:n])
	return resp.StatusCode, b.String()
}

func errMessage(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Message == "" {
		t.Fatalf("not an error body: %s", body)
	}
	return e.Message
}

// TestTemplateBuildRoutes: E2B's build flow over the routes (request, files
// link and upload, trigger, status paging, aliases, tags, publish, list,
// delete) and every bad input answering E2B's error, on a real daemon with
// the scripted test double as the engine.
func TestTemplateBuildRoutes(t *testing.T) {
	eng := newScripted()
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{Builder: eng})
	e := e2bT{apiT: apiT{env: env}, t: t}
	key := env.APIKey
	hash := strings.Repeat("0f", 32)

	t.Run("HappyPathAndPaging", func(t *testing.T) {
		e.t = t
		r := e.request(key, "paged-demo:v1")
		if r.TemplateID == "" || len(r.TemplateID) != 20 || len(r.BuildID) != 36 || fmt.Sprint(r.Tags) != "[v1]" ||
			fmt.Sprint(r.Aliases) != "[paged-demo]" || fmt.Sprint(r.Names) != "[admin/paged-demo]" || r.Public {
			t.Fatalf("answer %+v", r)
		}
		if s := e.status(key, r, 0); s.Status != "waiting" || len(s.LogEntries) != 0 || s.Logs == nil {
			t.Fatalf("before the trigger: %+v", s)
		}
		if present := e.upload(key, r, hash, "tar bytes"); present {
			t.Fatal("present before the upload")
		}
		var link struct{ Present bool }
		e.json("GET", "/templates/"+r.TemplateID+"/files/"+hash, key, nil, 201, &link)
		if !link.Present {
			t.Fatal("not present after the upload")
		}
		e.trigger(key, r, map[string]any{"fromImage": "python:3.12-slim", "force": false, "startCmd": "python server.py", "readyCmd": "true",
			"steps": append(steps("lines 250"), map[string]any{"type": "copy", "args": []string{"app", "/home/user/app", "", ""},
				"force": false, "filesHash": hash, "forceUpload": true, "gzip": false, "resolveSymlinks": true})})
		s, lines := e.wait(key, r)
		if s.Status != "ready" || s.Reason != nil {
			t.Fatalf("end: %+v", s)
		}
		// Every line once, in order.
		if len(lines) != 253 || !strings.HasPrefix(lines[0], "Building template e2b."+r.TemplateID+"."+r.BuildID) ||
			!strings.HasPrefix(lines[252], "Build finished") {
			t.Fatalf("%d lines: first %q last %q", len(lines), lines[0], lines[len(lines)-1])
		}
		for i := range 250 {
			if lines[2+i] != fmt.Sprintf("line %d", i) {
				t.Fatalf("line %d is %q", 2+i, lines[2+i])
			}
		}
		// Pages: 100, then limit honoured, past the end empty.
		var page buildStatus
		e.json("GET", "/templates/"+r.TemplateID+"/builds/"+r.BuildID+"/status?logsOffset=200&limit=7", key, nil, 200, &page)
		if len(page.LogEntries) != 7 || page.LogEntries[0].Message != "line 198" || page.LogEntries[0].Step != "1" {
			t.Fatalf("page: %+v", page.LogEntries)
		}
		if s := e.status(key, r, 1000); len(s.LogEntries) != 0 {
			t.Fatalf("past the end: %d entries", len(s.LogEntries))
		}
		spec := eng.lastSpec()
		if spec.Base.Image != "python:3.12-slim" || spec.Steps[1].Type != "COPY" || spec.Steps[1].FilesHash != hash ||
			spec.StartCmd != "python server.py" || spec.CPUs != 2 || spec.MemoryMB != 1024 || spec.Name == "paged-demo" {
			t.Fatalf("spec: %+v", spec)
		}
		// The build is its tag's; the template's alias exists, the tag too.
		var alias struct {
			TemplateID string `json:"templateID"`
			Public     bool   `json:"public"`
		}
		e.json("GET", "/templates/aliases/paged-demo%3Av1", key, nil, 200, &alias)
		if alias.TemplateID != r.TemplateID {
			t.Fatalf("alias: %+v", alias)
		}
		e.json("GET", "/templates/aliases/admin%2Fpaged-demo", key, nil, 200, nil)
		e.json("GET", "/templates/aliases/paged-demo%3Anosuchtag", key, nil, 404, nil)
		e.json("GET", "/templates/aliases/base", key, nil, 200, nil)

		// A rebuild of the alias is the same template; the files are present.
		r2 := e.request(key, "paged-demo", "stable", "v2")
		if r2.TemplateID != r.TemplateID || fmt.Sprint(r2.Tags) != "[stable v2]" {
			t.Fatalf("rebuild: %+v", r2)
		}
		e.json("GET", "/templates/"+r.TemplateID+"/files/"+hash, key, nil, 201, &link)
		if !link.Present {
			t.Fatal("the team's files cache lost the upload")
		}
		e.trigger(key, r2, map[string]any{"fromTemplate": "paged-demo:v1", "steps": steps("lines 1")})
		if s, _ := e.wait(key, r2); s.Status != "ready" {
			t.Fatalf("rebuild: %+v", s)
		}
		if got := eng.lastSpec().Base.Template; got != spec.Name {
			t.Fatalf("fromTemplate paged-demo:v1 gave base %q, want the v1 build's %q", got, spec.Name)
		}

		// Tags.
		var assigned struct {
			BuildID string   `json:"buildID"`
			Tags    []string `json:"tags"`
		}
		e.json("POST", "/templates/tags", key, map[string]any{"target": "paged-demo:v1", "tags": []string{"production"}}, 201, &assigned)
		if assigned.BuildID != r.BuildID || fmt.Sprint(assigned.Tags) != "[production]" {
			t.Fatalf("assign: %+v", assigned)
		}
		var tags []struct {
			Tag       string    `json:"tag"`
			BuildID   string    `json:"buildID"`
			CreatedAt time.Time `json:"createdAt"`
		}
		e.json("GET", "/templates/"+r.TemplateID+"/tags", key, nil, 200, &tags)
		got := map[string]string{}
		for _, tg := range tags {
			got[tg.Tag] = tg.BuildID
		}
		if fmt.Sprint(got) != fmt.Sprint(map[string]string{"production": r.BuildID, "stable": r2.BuildID, "v1": r.BuildID, "v2": r2.BuildID}) {
			t.Fatalf("tags: %v", got)
		}
		e.json("GET", "/templates/admin%2Fpaged-demo/tags", key, nil, 200, nil)
		e.json("DELETE", "/templates/tags", key, map[string]any{"name": "paged-demo", "tags": []string{"production"}}, 204, nil)
		e.json("GET", "/templates/aliases/paged-demo%3Aproduction", key, nil, 404, nil)
		e.json("DELETE", "/templates/tags", key, map[string]any{"name": "paged-demo", "tags": []string{"production"}}, 404, nil)
		e.json("DELETE", "/templates/tags", key, map[string]any{"name": "paged-demo:v1", "tags": []string{"v2"}}, 400, nil)
		e.json("DELETE", "/templates/tags", key, map[string]any{"name": "paged-demo", "tags": []string{"default"}}, 400, nil)
		e.json("POST", "/templates/tags", key, map[string]any{"target": "paged-demo:nope", "tags": []string{"x"}}, 404, nil)
		e.json("POST", "/templates/tags", key, map[string]any{"target": "paged-demo", "tags": []string{}}, 400, nil)

		// List, publish, delete (twice: the second is the unknown's 404).
		var list []struct {
			TemplateID  string   `json:"templateID"`
			Aliases     []string `json:"aliases"`
			Public      bool     `json:"public"`
			BuildStatus string   `json:"buildStatus"`
		}
		e.json("GET", "/templates", key, nil, 200, &list)
		found := false
		for _, l := range list {
			if l.TemplateID == r.TemplateID {
				found = l.Aliases[0] == "paged-demo" && l.BuildStatus == "ready"
			}
			if strings.HasPrefix(l.TemplateID, "e2b.") {
				t.Fatalf("a build's store name is listed: %+v", l)
			}
		}
		if !found {
			t.Fatalf("the template is not listed: %+v", list)
		}
		var pub struct{ Names []string }
		e.json("PATCH", "/v2/templates/"+r.TemplateID, key, map[string]any{"public": true}, 200, &pub)
		if fmt.Sprint(pub.Names) != "[admin/paged-demo]" {
			t.Fatalf("publish: %+v", pub)
		}
		e.json("DELETE", "/templates/"+r.TemplateID, key, nil, 204, nil)
		b := e.json("DELETE", "/templates/"+r.TemplateID, key, nil, 404, nil)
		if !strings.Contains(errMessage(t, b), "not found") {
			t.Fatalf("second delete: %s", b)
		}
		e.json("GET", "/templates/aliases/paged-demo", key, nil, 404, nil)
	})

	t.Run("BadInputs", func(t *testing.T) {
		e.t = t
		for name, body := range map[string]any{
			"bad name":          map[string]any{"name": "Bad Name!"},
			"no name":           map[string]any{},
			"long name":         map[string]any{"name": strings.Repeat("a", 129)},
			"uuid tag":          map[string]any{"name": "x:0b46bb07-b429-41b8-820e-861c28b9f6d9"},
			"foreign namespace": map[string]any{"name": "other-team/x"},
			"odd cpus":          map[string]any{"name": "x", "cpuCount": 3},
			"little memory":     map[string]any{"name": "x", "memoryMB": 64},
			"bad tag":           map[string]any{"name": "x", "tags": []string{"Bad Tag"}},
			"not JSON":          "{",
			"name not a string": `{"name": 7}`,
		} {
			st, _, b := e.do(t, "POST", "/v3/templates", key, body, nil)
			if st != 400 {
				t.Errorf("%s: %d %s, want 400", name, st, b)
			}
		}
		_, _, b := e.do(t, "POST", "/v3/templates", key, map[string]any{"name": "Bad Name!"}, nil)
		if msg := errMessage(t, b); !strings.HasPrefix(msg, "Invalid template name") {
			t.Errorf("bad name: %q", msg)
		}
		for _, alias := range []string{"base", "code-interpreter-v1", "desktop"} {
			st, _, b := e.do(t, "POST", "/v3/templates", key, map[string]any{"name": alias}, nil)
			if st != 409 || !strings.Contains(errMessage(t, b), "Alias '"+alias+"' is already used") {
				t.Errorf("%s: %d %s, want 409", alias, st, b)
			}
		}

		r := e.request(key, "bad-inputs")
		e.json("GET", "/templates/"+r.TemplateID+"/files/xyz", key, nil, 400, nil)
		e.json("GET", "/templates/"+r.TemplateID+"/files/"+strings.Repeat("A", 64), key, nil, 400, nil)
		e.json("GET", "/templates/nosuchtemplate/files/"+hash, key, nil, 404, nil)
		unknown := "00000000-0000-4000-8000-000000000000"
		b = e.json("GET", "/templates/"+r.TemplateID+"/builds/"+unknown+"/status", key, nil, 400, nil)
		if msg := errMessage(t, b); msg != "Build '"+unknown+"' not found" {
			t.Errorf("unknown build: %q", msg)
		}
		e.json("GET", "/templates/"+r.TemplateID+"/builds/"+r.BuildID+"/status?logsOffset=-1", key, nil, 400, nil)
		e.json("GET", "/templates/"+r.TemplateID+"/builds/"+r.BuildID+"/status?logsOffset=x", key, nil, 400, nil)
		e.json("GET", "/templates/"+r.TemplateID+"/builds/"+r.BuildID+"/status?limit=101", key, nil, 400, nil)
		e.json("POST", "/v2/templates/"+r.TemplateID+"/builds/"+unknown, key, map[string]any{"fromImage": "x", "steps": []any{}}, 404, nil)
		trig := "/v2/templates/" + r.TemplateID + "/builds/" + r.BuildID
		e.json("POST", trig, key, `{"fromImage":"x","steps":"RUN ls"}`, 400, nil)
		e.json("POST", trig, key, `{"fromImage":"x","steps":[{"type":"RUN","args":"ls"}]}`, 400, nil)
		e.json("POST", trig, key, `{"fromImage":"x","steps":[`, 400, nil)
		e.json("POST", trig, key, map[string]any{"steps": []any{}}, 400, nil)
		e.json("POST", trig, key, map[string]any{"fromImage": "x", "fromTemplate": "base", "steps": []any{}}, 400, nil)
		if s := e.status(key, r, 0); s.Status != "waiting" {
			t.Fatalf("a refused trigger changed the build: %+v", s)
		}

		// Recipe errors fail the build at their step.
		for name, c := range map[string]struct {
			body      map[string]any
			step, msg string
		}{
			"unknown type": {map[string]any{"fromImage": "x", "steps": append(steps("lines 1"), map[string]any{"type": "FOO", "args": []string{"a"}})},
				"2", "command type FOO is not implemented"},
			"RUN without command": {map[string]any{"fromImage": "x", "steps": []any{map[string]any{"type": "RUN", "args": []string{}}}},
				"1", "RUN takes [command]"},
			"COPY without hash": {map[string]any{"fromImage": "x", "steps": []any{map[string]any{"type": "COPY", "args": []string{"a", "/b", "", ""}}}},
				"1", "COPY requires files hash to be set"},
			"COPY not uploaded": {map[string]any{"fromImage": "x", "steps": append(steps("lines 1", "lines 1"),
				map[string]any{"type": "COPY", "args": []string{"a", "/b", "", ""}, "filesHash": strings.Repeat("ee", 32)})},
				"3", "were not uploaded"},
			"odd ENV": {map[string]any{"fromImage": "x", "steps": []any{map[string]any{"type": "ENV", "args": []string{"A"}}}},
				"1", "ENV takes pairs"},
			"failing RUN": {map[string]any{"fromImage": "x", "steps": steps("lines 2", "lines 1", "fail")},
				"3", "failed to run command 'fail': exit status 1"},
			"missing base template": {map[string]any{"fromTemplate": "does-not-exist", "steps": []any{}},
				"base", "not found"},
		} {
			r := e.request(key, "bad-recipe")
			e.trigger(key, r, c.body)
			s, lines := e.wait(key, r)
			if s.Status != "error" || s.Reason == nil || s.Reason.Step != c.step || !strings.Contains(s.Reason.Message, c.msg) {
				t.Errorf("%s: %+v, want error at step %s: %s", name, s, c.step, c.msg)
				continue
			}
			if last := lines[len(lines)-1]; last != "Build failed: "+s.Reason.Message {
				t.Errorf("%s: last line %q", name, last)
			}
			if name == "failing RUN" && len(s.Reason.LogEntries) != 0 {
				t.Errorf("the final page's reason has entries of other pages: %s", s.Reason.LogEntries)
			}
			e.json("POST", "/v2/templates/"+r.TemplateID+"/builds/"+r.BuildID, key, map[string]any{"fromImage": "x"}, 400, nil)
		}
		// The failing RUN's reason carries its step's warnings on their page.
		r = e.request(key, "bad-recipe")
		e.trigger(key, r, map[string]any{"fromImage": "x", "steps": steps("fail")})
		s, _ := e.wait(key, r)
		if p := e.status(key, r, 0); len(p.Reason.LogEntries) != 1 || s.Reason.Step != "1" {
			t.Errorf("reason.logEntries of the first page: %s", p.Reason.LogEntries)
		}
		// Empty steps are a template of its base alone.
		r = e.request(key, "bad-recipe")
		e.trigger(key, r, map[string]any{"fromImage": "e2bdev/base", "steps": []any{}, "force": true})
		if s, _ := e.wait(key, r); s.Status != "ready" {
			t.Errorf("empty steps: %+v", s)
		}
		if sp := eng.lastSpec(); sp.Base.Template != "base" || sp.Base.Image != "" || !sp.Force {
			t.Errorf("e2bdev/base: %+v", sp.Base)
		}
		// A second request supersedes a build left waiting.
		r1 := e.request(key, "bad-recipe")
		e.request(key, "bad-recipe")
		if s, _ := e.wait(key, r1); s.Status != "error" || !strings.Contains(s.Reason.Message, "superseded") {
			t.Errorf("superseded: %+v", s)
		}
	})

	t.Run("TamperedUpload", func(t *testing.T) {
		e.t = t
		r := e.request(key, "tamper")
		var link struct{ URL string }
		e.json("GET", "/templates/"+r.TemplateID+"/files/"+hash, key, nil, 201, &link)
		u, err := url.Parse(link.URL)
		if err != nil || u.Host != strings.TrimPrefix(env.URL, "http://") {
			t.Fatalf("upload URL %q", link.URL)
		}
		q := u.Query()
		for name, change := range map[string]func(url.Values) string{
			"token":   func(v url.Values) string { v.Set("token", strings.Repeat("0", 64)); return "" },
			"team":    func(v url.Values) string { v.Set("team", "admin2"); return "" },
			"expires": func(v url.Values) string { v.Set("expires", "99999999999"); return "" },
			"hash":    func(v url.Values) string { return strings.Repeat("11", 32) },
		} {
			v := url.Values{}
			for k, x := range q {
				v[k] = x
			}
			h := change(v)
			tu := *u
			tu.RawQuery = v.Encode()
			if h != "" {
				tu.Path = strings.Replace(tu.Path, hash, h, 1)
			}
			st, body := putURL(t, tu.String(), "x")
			if st != 403 || !strings.Contains(body, "invalid or expired upload token") {
				t.Errorf("tampered %s: %d %s, want 403", name, st, body)
			}
		}
		tu := *u
		tu.RawQuery = ""
		if st, _ := putURL(t, tu.String(), "x"); st != 400 {
			t.Errorf("no token: %d, want 400", st)
		}
		if st, body := putURL(t, link.URL, "x"); st != 200 || body != "" {
			t.Errorf("the untouched URL: %d %q", st, body)
		}
	})
}

// TestTemplateBuildTenancy: a second team's key on every template route
// gets exactly what an unknown template or build gets; a published
// template becomes usable (not changeable) by it; the admin sees all.
func TestTemplateBuildTenancy(t *testing.T) {
	eng := newScripted()
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{Builder: eng})
	e := e2bT{apiT: apiT{env: env}, t: t}
	ctx := context.Background()
	newKey := func(nk client.NewKey) client.Key {
		k, err := env.Client.CreateKey(ctx, nk)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	alice := newKey(client.NewKey{Name: "alice", Team: "red"}).Key
	alice2 := newKey(client.NewKey{Name: "alice2", Team: "red"}).Key
	bob := newKey(client.NewKey{Name: "bob", Team: "blue"}).Key
	hash := strings.Repeat("ab", 32)

	r := e.request(alice, "red/red-app:v1")
	if fmt.Sprint(r.Names) != "[red/red-app]" {
		t.Fatalf("names %v", r.Names)
	}
	e.upload(alice, r, hash, "alice's files")
	e.trigger(alice, r, map[string]any{"fromImage": "x", "steps": []any{
		map[string]any{"type": "COPY", "args": []string{"a", "/a", "", ""}, "filesHash": hash}}})
	if s, _ := e.wait(alice, r); s.Status != "ready" {
		t.Fatalf("alice's build: %+v", s)
	}
	store := eng.lastSpec().Name
	pending := e.request(alice, "red-pending")

	// same: bob's answer equals the answer to a template or build nobody has.
	same := func(what, method, victim, unknown string, body, unknownBody any) {
		t.Helper()
		st, _, got := e.do(t, method, victim, bob, body, nil)
		ust, _, want := e.do(t, method, unknown, bob, unknownBody, nil)
		norm := func(b []byte) string {
			s := string(b)
			for _, x := range []string{store, r.TemplateID, r.BuildID, "red-app", pending.TemplateID, pending.BuildID, "nosuch-tpl",
				"00000000-0000-4000-8000-000000000000", "nosuch-app", "e2b.nosuch"} {
				s = strings.ReplaceAll(s, x, "X")
			}
			return s
		}
		if st != ust || norm(got) != norm(want) || st < 400 {
			t.Errorf("%s: bob got %d %s; an unknown one gets %d %s", what, st, got, ust, want)
		}
	}
	ub := "00000000-0000-4000-8000-000000000000"
	same("files link", "GET", "/templates/"+r.TemplateID+"/files/"+hash, "/templates/nosuch-tpl/files/"+hash, nil, nil)
	same("status", "GET", "/templates/"+r.TemplateID+"/builds/"+r.BuildID+"/status", "/templates/nosuch-tpl/builds/"+ub+"/status", nil, nil)
	same("status by alias", "GET", "/templates/red-app/builds/"+r.BuildID+"/status", "/templates/nosuch-app/builds/"+ub+"/status", nil, nil)
	same("trigger", "POST", "/v2/templates/"+pending.TemplateID+"/builds/"+pending.BuildID, "/v2/templates/nosuch-tpl/builds/"+ub,
		map[string]any{"fromImage": "x", "steps": []any{}}, map[string]any{"fromImage": "x", "steps": []any{}})
	same("alias", "GET", "/templates/aliases/red-app", "/templates/aliases/nosuch-app", nil, nil)
	same("alias:tag", "GET", "/templates/aliases/red-app%3Av1", "/templates/aliases/nosuch-app%3Av1", nil, nil)
	same("tags by ID", "GET", "/templates/"+r.TemplateID+"/tags", "/templates/nosuch-tpl/tags", nil, nil)
	same("tags by alias", "GET", "/templates/red-app/tags", "/templates/nosuch-app/tags", nil, nil)
	same("assign tags", "POST", "/templates/tags", "/templates/tags",
		map[string]any{"target": "red-app:v1", "tags": []string{"mine"}}, map[string]any{"target": "nosuch-app:v1", "tags": []string{"mine"}})
	same("remove tags", "DELETE", "/templates/tags", "/templates/tags",
		map[string]any{"name": "red-app", "tags": []string{"v1"}}, map[string]any{"name": "nosuch-app", "tags": []string{"v1"}})
	same("publish", "PATCH", "/v2/templates/"+r.TemplateID, "/v2/templates/nosuch-tpl", map[string]any{"public": true}, map[string]any{"public": true})
	same("delete by ID", "DELETE", "/templates/"+r.TemplateID, "/templates/nosuch-tpl", nil, nil)
	same("delete by alias", "DELETE", "/templates/red-app", "/templates/nosuch-app", nil, nil)
	same("delete by store name", "DELETE", "/templates/"+store, "/templates/e2b.nosuch", nil, nil)
	same("sandbox from the alias", "POST", "/v2/sandboxes", "/v2/sandboxes", map[string]any{"templateID": "red-app"}, map[string]any{"templateID": "nosuch-app"})
	same("sandbox from alias:tag", "POST", "/v2/sandboxes", "/v2/sandboxes", map[string]any{"templateID": "red-app:v1"}, map[string]any{"templateID": "nosuch-app:v1"})
	same("sandbox from the ID", "POST", "/v2/sandboxes", "/v2/sandboxes", map[string]any{"templateID": r.TemplateID}, map[string]any{"templateID": "nosuch-tpl"})
	same("sandbox from the store name", "POST", "/v2/sandboxes", "/v2/sandboxes", map[string]any{"templateID": store}, map[string]any{"templateID": "e2b.nosuch"})

	// Bob's own build on alice's template fails at base as an unknown one does.
	rb := e.request(bob, "blue-app")
	e.trigger(bob, rb, map[string]any{"fromTemplate": "red-app", "steps": []any{}})
	sb, _ := e.wait(bob, rb)
	rb2 := e.request(bob, "blue-app")
	e.trigger(bob, rb2, map[string]any{"fromTemplate": "nosuch-app", "steps": []any{}})
	su, _ := e.wait(bob, rb2)
	if sb.Status != "error" || sb.Reason.Step != "base" || strings.ReplaceAll(sb.Reason.Message, "red-app", "X") != strings.ReplaceAll(su.Reason.Message, "nosuch-app", "X") {
		t.Errorf("bob's fromTemplate red-app: %+v; unknown: %+v", sb.Reason, su.Reason)
	}
	// Alice's COPY files are not in bob's cache: the same hash is absent for him.
	var link struct{ Present bool }
	e.json("GET", "/templates/"+rb.TemplateID+"/files/"+hash, bob, nil, 201, &link)
	if link.Present {
		t.Error("bob's team sees alice's uploaded files as present")
	}
	// The alias is taken for bob's team: 409.
	if st, _, body := e.do(t, "POST", "/v3/templates", bob, map[string]any{"name": "red-app"}, nil); st != 409 {
		t.Errorf("bob requesting alice's alias: %d %s", st, body)
	}
	var list []struct {
		TemplateID string `json:"templateID"`
	}
	e.json("GET", "/templates", bob, nil, 200, &list)
	for _, l := range list {
		if l.TemplateID == r.TemplateID || l.TemplateID == pending.TemplateID {
			t.Errorf("bob's list shows alice's %s", l.TemplateID)
		}
	}
	// Alice's second key is her team's: it sees and changes the template.
	e.json("GET", "/templates/aliases/red-app", alice2, nil, 200, nil)
	e.json("POST", "/templates/tags", alice2, map[string]any{"target": "red-app:v1", "tags": []string{"prod"}}, 201, nil)

	// Published: bob may use it, not change it.
	e.json("PATCH", "/v2/templates/"+r.TemplateID, alice, map[string]any{"public": true}, 200, nil)
	var alias struct {
		Public bool `json:"public"`
	}
	e.json("GET", "/templates/aliases/red-app", bob, nil, 200, &alias)
	if !alias.Public {
		t.Error("published but not public")
	}
	e.json("GET", "/templates/red-app/tags", bob, nil, 200, nil)
	rb3 := e.request(bob, "blue-app")
	e.trigger(bob, rb3, map[string]any{"fromTemplate": "red-app:v1", "steps": []any{}})
	if s, _ := e.wait(bob, rb3); s.Status != "ready" || eng.lastSpec().Base.Template != store {
		t.Errorf("bob building on the published template: %+v base %q", s, eng.lastSpec().Base.Template)
	}
	same("assign tags (public)", "POST", "/templates/tags", "/templates/tags",
		map[string]any{"target": "red-app:v1", "tags": []string{"mine"}}, map[string]any{"target": "nosuch-app:v1", "tags": []string{"mine"}})
	same("delete (public)", "DELETE", "/templates/"+r.TemplateID, "/templates/nosuch-tpl", nil, nil)
	same("unpublish (public)", "PATCH", "/v2/templates/"+r.TemplateID, "/v2/templates/nosuch-tpl", map[string]any{"public": false}, map[string]any{"public": false})
	same("files link (public)", "GET", "/templates/"+r.TemplateID+"/files/"+hash, "/templates/nosuch-tpl/files/"+hash, nil, nil)
	eng.mu.Lock()
	if p := eng.actors[len(eng.actors)-1]; p.Team == "" || p.Team != keyTeam(t, env, bob) {
		t.Errorf("bob's build ran as %+v", p)
	}
	eng.mu.Unlock()

	// The admin sees and acts on everything.
	e.json("GET", "/templates/"+r.TemplateID+"/builds/"+r.BuildID+"/status", env.APIKey, nil, 200, nil)
	e.json("DELETE", "/templates/"+pending.TemplateID, env.APIKey, nil, 204, nil)
}

func keyTeam(t *testing.T, env *daemontest.Env, key string) string {
	t.Helper()
	c, err := client.New(client.Config{URL: env.URL, APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	k, err := c.SelfKey(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return k.TeamID
}

// TestTemplateBuildRestart: a build in progress when the daemon stops is
// failed with "the daemon restarted during the build" when the next daemon
// on the same data dir starts, its log kept; finished builds, aliases and
// tags outlive the restart.
func TestTemplateBuildRestart(t *testing.T) {
	dataDir := t.TempDir()
	eng := newScripted()
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{DataDir: dataDir, Builder: eng})
	e := e2bT{apiT: apiT{env: env}, t: t}
	done := e.request(env.APIKey, "restart-done:v1")
	e.trigger(env.APIKey, done, map[string]any{"fromImage": "x", "steps": steps("lines 3")})
	if s, _ := e.wait(env.APIKey, done); s.Status != "ready" {
		t.Fatalf("%+v", s)
	}
	r := e.request(env.APIKey, "restart-me")
	e.trigger(env.APIKey, r, map[string]any{"fromImage": "x", "steps": steps("lines 5", "wait")})
	select {
	case <-eng.waiting:
	case <-time.After(2 * time.Minute):
		t.Fatal("the build never reached its wait step")
	}
	if s := e.status(env.APIKey, r, 0); s.Status != "building" {
		t.Fatalf("before the restart: %+v", s)
	}
	env.Close()

	env2 := daemontest.Start(t, runtime.GVisor, daemontest.Options{DataDir: dataDir, Builder: newScripted()})
	e2 := e2bT{apiT: apiT{env: env2}, t: t}
	s, lines := e2.wait(env2.APIKey, r)
	if s.Status != "error" || s.Reason == nil || s.Reason.Message != "the daemon restarted during the build" {
		t.Fatalf("after the restart: %+v", s)
	}
	if len(lines) != 8 || lines[6] != "line 4" || lines[7] != "Build failed: the daemon restarted during the build" {
		t.Fatalf("the log after the restart: %q", lines)
	}
	if s, _ := e2.wait(env2.APIKey, done); s.Status != "ready" {
		t.Fatalf("the finished build after the restart: %+v", s)
	}
	e2.json("GET", "/templates/aliases/restart-done%3Av1", env2.APIKey, nil, 200, nil)
}

// TestOpenAPIConformanceTemplateBuilds holds the build routes' real
// exchanges to the OpenAPI document, strictly (no undocumented field).
func TestOpenAPIConformanceTemplateBuilds(t *testing.T) {
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{Builder: newScripted()})
	c := newContract(t, env.URL)
	key := env.APIKey
	hash := strings.Repeat("0f", 32)
	var r requested
	_, body := c.do(t, "POST", "/v3/templates", key, map[string]any{"name": "contract:v1", "tags": []string{"x"}, "cpuCount": 2, "memoryMB": 1024, "minFreeDiskMb": 0}, 202)
	json.Unmarshal(body, &r)
	c.do(t, "POST", "/v3/templates", key, map[string]any{"name": "Bad Name!"}, 400)
	c.do(t, "POST", "/v3/templates", key, map[string]any{"name": "base"}, 409)
	c.do(t, "POST", "/v3/templates", "", map[string]any{"name": "x"}, 401)
	_, body = c.do(t, "GET", "/templates/"+r.TemplateID+"/files/"+hash, key, nil, 201)
	var link struct{ URL string }
	json.Unmarshal(body, &link)
	c.do(t, "GET", "/templates/"+r.TemplateID+"/files/xyz", key, nil, 400)
	c.do(t, "GET", "/templates/nosuch/files/"+hash, key, nil, 404)
	u, _ := url.Parse(link.URL)
	c.do(t, "PUT", u.RequestURI(), "", nil, 200)
	q := u.Query()
	q.Set("token", strings.Repeat("0", 64))
	c.do(t, "PUT", u.Path+"?"+q.Encode(), "", nil, 403)
	status := "/templates/" + r.TemplateID + "/builds/" + r.BuildID + "/status"
	c.do(t, "GET", status, key, nil, 200)
	c.do(t, "POST", "/v2/templates/"+r.TemplateID+"/builds/"+r.BuildID, key, map[string]any{"fromImage": "python:3.12-slim", "force": false,
		"steps": []any{map[string]any{"type": "RUN", "args": []string{"lines 3", "root"}, "force": false},
			map[string]any{"type": "COPY", "args": []string{"app", "/app", "", ""}, "force": false, "filesHash": hash}},
		"startCmd": "sleep infinity", "readyCmd": "true", "fromImageRegistry": map[string]any{"type": "registry", "username": "u", "password": "p"}}, 202)
	c.do(t, "POST", "/v2/templates/"+r.TemplateID+"/builds/"+r.BuildID, key, map[string]any{"fromImage": "x"}, 400)
	e := e2bT{apiT: apiT{env: env}, t: t}
	e.wait(key, r)
	c.do(t, "GET", status+"?logsOffset=1&limit=2", key, nil, 200)
	c.do(t, "GET", status+"?logsOffset=-1", key, nil, 400)
	c.do(t, "GET", "/templates/"+r.TemplateID+"/builds/00000000-0000-4000-8000-000000000000/status", key, nil, 400)
	failed := e.request(key, "contract-fail")
	e.trigger(key, failed, map[string]any{"fromImage": "x", "steps": steps("fail")})
	e.wait(key, failed)
	c.do(t, "GET", "/templates/"+failed.TemplateID+"/builds/"+failed.BuildID+"/status", key, nil, 200)
	c.do(t, "GET", "/templates/aliases/contract%3Av1", key, nil, 200)
	c.do(t, "GET", "/templates/aliases/nosuch", key, nil, 404)
	c.do(t, "GET", "/templates/aliases/Bad%20Name", key, nil, 400)
	c.do(t, "GET", "/templates/"+r.TemplateID+"/tags", key, nil, 200)
	c.do(t, "GET", "/templates/nosuch/tags", key, nil, 404)
	c.do(t, "POST", "/templates/tags", key, map[string]any{"target": "contract:v1", "tags": []string{"prod"}}, 201)
	c.do(t, "POST", "/templates/tags", key, map[string]any{"target": "contract:nope", "tags": []string{"prod"}}, 404)
	c.do(t, "DELETE", "/templates/tags", key, map[string]any{"name": "contract", "tags": []string{"prod"}}, 204)
	c.do(t, "DELETE", "/templates/tags", key, map[string]any{"name": "contract", "tags": []string{"default"}}, 400)
	c.do(t, "PATCH", "/v2/templates/"+r.TemplateID, key, map[string]any{"public": true}, 200)
	c.do(t, "PATCH", "/v2/templates/nosuch", key, map[string]any{"public": true}, 404)
	c.do(t, "GET", "/templates", key, nil, 200)
	c.do(t, "DELETE", "/templates/"+r.TemplateID, key, nil, 204)
	c.do(t, "DELETE", "/templates/"+failed.TemplateID, key, nil, 204)
	c.do(t, "DELETE", "/templates/"+r.TemplateID, key, nil, 404)
}
