package api

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestUnitBodies: what each route reads from its body and query, and the
// JSON 400 naming the field or the limit for bad input; unknown fields are
// accepted (newer SDKs send fields this daemon does not know).
func TestUnitBodies(t *testing.T) {
	u := newUnitAPI(t)
	u.sbs.add("sbxa", u.srv.principal(mustKey(t, u, unitKeyA)).Owner())
	big := `{"templateID":"base","metadata":{"k":"` + strings.Repeat("x", 1<<20) + `"}}`
	for _, c := range []struct {
		method, path, body string
		status             int
		msg                string // in the error's message, or a call made to the core
	}{
		{"POST", "/v2/sandboxes", "{", 400, "invalid JSON body"},
		{"POST", "/v2/sandboxes", `{"timeout":"soon"}`, 400, `field "timeout" must be int64`},
		{"POST", "/v2/sandboxes", `{"metadata":["x"]}`, 400, `field "metadata"`},
		{"POST", "/v2/sandboxes", `{"timeout":-1}`, 400, "timeout must be between 0 and"},
		{"POST", "/v2/sandboxes", `{"timeout":99999999999}`, 400, "timeout must be between 0 and"},
		{"POST", "/v2/sandboxes", big, 400, "request body is larger than 1048576 bytes"},
		{"POST", "/v2/sandboxes", `{"templateID":"base","aFieldFromANewerSDK":{"x":[1]}}`, 201, ""},
		{"POST", "/sandboxes/sbxa/timeout", `{}`, 400, "timeout (seconds) is required"},
		{"POST", "/sandboxes/sbxa/timeout", `{"timeout":30}`, 204, "SetTimeout 30s sbxa"},
		{"POST", "/sandboxes/sbxa/refreshes", ``, 204, "Extend 1m0s sbxa"},
		{"POST", "/sandboxes/sbxa/refreshes", `{"duration":-5}`, 400, "duration must be between 0 and"},
		{"POST", "/sandboxes/sbxa/connect", `{"timeout":10,"memory":false}`, 200, "Connect 10s false sbxa"},
		{"POST", "/sandboxes/sbxa/pause", ``, 204, "Pause true sbxa"},
		{"POST", "/sandboxes/sbxa/fork", `{"count":0}`, 400, "count must be between 1 and"},
		{"POST", "/sandboxes/sbxa/wait", `{"port":1,"log":"x"}`, 400, "not both"},
		{"POST", "/sandboxes/sbxa/wait", `{}`, 400, "wait for what?"},
		{"POST", "/volumes", `{"name":"v","sizeMB":1,"size":"1G"}`, 400, "give sizeMB or size, not both"},
		{"POST", "/volumes", `{"name":"v","size":"lots"}`, 400, `invalid size "lots"`},
		{"GET", "/v2/sandboxes?limit=0", ``, 400, "limit must be an integer from 1 to 100"},
		{"GET", "/v2/sandboxes?state=asleep", ``, 400, `invalid state "asleep"`},
		{"GET", "/v2/sandboxes?order=up", ``, 400, "order must be asc or desc"},
		{"GET", "/v2/sandboxes?nextToken=x", ``, 400, `invalid nextToken "x"`},
		{"GET", "/sandboxes/sbxa/metrics?start=1&end=0", ``, 400, "end (0) is before start (1)"},
		{"GET", "/sandboxes/sbxa/metrics?start=x", ``, 400, "start must be a unix time"},
	} {
		what := c.method + " " + c.path + " " + c.body[:min(len(c.body), 60)]
		rec := u.doJSON(c.method, c.path, unitKeyA, c.body)
		if rec.Code != c.status {
			t.Errorf("%s: %d %.200s, want %d", what, rec.Code, rec.Body, c.status)
			continue
		}
		if rec.Code >= 400 {
			if !isJSONError(rec) || !strings.Contains(errMessage(rec), c.msg) {
				t.Errorf("%s: %.200s, want a JSON error containing %q", what, rec.Body, c.msg)
			}
		} else if c.msg != "" && !slices.Contains(u.sbs.calls, c.msg) {
			t.Errorf("%s: the core was called %v, want %q", what, u.sbs.calls, c.msg)
		}
	}
	// The admin's pool size is required.
	if rec := u.doJSON("PUT", "/pools/base", unitAdminKey, `{}`); rec.Code != 400 || !strings.Contains(rec.Body.String(), "give the pool's size") {
		t.Errorf("PUT /pools/base {}: %d %s", rec.Code, rec.Body)
	}
}

// TestUnitCreateDefaults: E2B's v1 create defaults its timeout to 15 s, v2
// leaves it to the manager (300 s); the sandbox belongs to the caller.
func TestUnitCreateDefaults(t *testing.T) {
	u := newUnitAPI(t)
	for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
		if rec := u.doJSON("POST", path, unitKeyA, `{"templateID":"base","metadata":{"a":"b"}}`); rec.Code != http.StatusCreated || !strings.Contains(rec.Body.String(), `"sandboxID":"sbx`) {
			t.Fatalf("POST %s: %d %s", path, rec.Code, rec.Body)
		}
	}
	if len(u.sbs.created) != 2 {
		t.Fatalf("%d creates", len(u.sbs.created))
	}
	v1, v2 := u.sbs.created[0], u.sbs.created[1]
	if v1.Timeout != 15*time.Second || v2.Timeout != 0 {
		t.Errorf("timeouts: v1 %v, v2 %v; want 15s and 0 (the manager's default)", v1.Timeout, v2.Timeout)
	}
	if v1.TemplateID != "base" || v1.Metadata["a"] != "b" || v1.TeamID != "team-a" || v1.APIKeyID != "ka" {
		t.Errorf("options: %+v", v1)
	}
}
