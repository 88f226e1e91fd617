package api

// Fuzz targets of everything the routes read from a request before they act
// (bodies.go, createOptions, parseNetworkUpdate, parseKeyCreate, the query
// parsers; the routing of sandbox traffic is internal/edge's
// FuzzSandboxTarget): arbitrary input is parsed, or refused with an
// InvalidArgument or Forbidden error (a 400 or 403), never a panic or a 5xx
// kind, and what is parsed keeps the limits the rest of the daemon relies
// on. The handlers themselves call a concrete *sandbox.Manager, so these
// stop where the manager begins (its own checks are fuzzed in
// internal/sandbox). `go test` runs the seeds and testdata/fuzz; `go test
// -run=^$ -fuzz=FuzzCreateSandboxBody ./internal/api/` explores.

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/edge"
	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/secrets"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// The daemon's ceiling in these targets, and a key's narrower one.
var (
	fuzzCeiling = egress.Policy{AllowOut: []string{"pkg.test", "*.github.test", "10.0.0.0/8"}, DenyOut: []string{"evil.github.test"}}
	fuzzKeyCeil = egress.Policy{AllowOut: []string{"pkg.test", "api.github.test"}, DenyOut: []string{"evil.github.test"}}
)

func fuzzServer() *Server {
	c := fuzzCeiling
	return New(Config{EgressCeiling: &c})
}

// fuzzPrincipal is the admin key, or a team's key that may use the secret
// GRANTED only, under its own ceiling.
func fuzzPrincipal(admin bool) tenant.Principal {
	if admin {
		c := fuzzCeiling
		return tenant.Principal{Key: "admin", Team: tenant.AdminTeam, Admin: true, Ceiling: &c}
	}
	c := fuzzKeyCeil
	return tenant.Principal{Key: "k1", Team: "team1", Secrets: []string{"GRANTED"}, Ceiling: &c}
}

func fuzzRequest(method, target string, body []byte, p tenant.Principal) *http.Request {
	r := httptest.NewRequest(method, "http://cella.test"+target, bytes.NewReader(body))
	return r.WithContext(context.WithValue(r.Context(), principalCtx{}, p))
}

// want4xx fails unless err is bad input or a refusal of the caller.
func want4xx(t *testing.T, what string, err error) {
	t.Helper()
	if st := errdefs.HTTPStatus(err); st != http.StatusBadRequest && st != http.StatusForbidden {
		t.Fatalf("%s: %v is a %d, not a 400 or 403", what, err, st)
	}
}

// allowedWithin fails when p allows a probe host that ceiling does not.
func allowedWithin(t *testing.T, what string, p *egress.Policy, ceiling egress.Policy) {
	t.Helper()
	hosts := []string{"any.test", "10.1.2.3", "1.1.1.1", "11.0.0.1"}
	for _, pol := range []egress.Policy{*p, ceiling} {
		for _, e := range append(append([]string{}, pol.AllowOut...), pol.DenyOut...) {
			e = strings.TrimPrefix(strings.ToLower(strings.TrimSpace(e)), "*.")
			if i := strings.IndexByte(e, '/'); i >= 0 {
				e = e[:i]
			}
			hosts = append(hosts, e, "sub."+e)
		}
	}
	for _, h := range hosts {
		if ok, rule := p.AllowsHost(h); ok {
			if cok, _ := ceiling.AllowsHost(h); !cok {
				t.Fatalf("%s: the policy %+v allows %q (by %s), which the ceiling %+v does not", what, p, h, rule, ceiling)
			}
		}
	}
}

var createSeeds = []string{
	``, `{}`, `null`, `[]`, `{"templateID":"base","timeout":60,"metadata":{"a":"b"},"envVars":{"A":"1"}}`,
	`{"timeout":-1}`, `{"timeout":18446744074}`, `{"timeout":9223372037}`, `{"timeout":86401}`,
	`{"cpuCount":2.5,"memoryMB":1024,"diskSizeMB":2048,"pidsLimit":512,"outputLimitMB":20}`,
	`{"memoryMB":8796093022208}`, `{"cpuCount":1e308}`, `{"envVars":{"A=B":"x"}}`, `{"envVars":{"A":"x\u0000"}}`,
	`{"allow_internet_access":false}`, `{"allow_internet_access":true,"network":{"allowOut":["pkg.test"]}}`,
	`{"network":{"allowOut":["evil.test"]}}`, `{"network":{"allowOut":["*"],"denyOut":["0.0.0.0/0"]}}`,
	`{"network":{"denyOut":["*"],"allowOut":["api.github.test"]}}`, `{"network":{"allowPublicTraffic":false}}`,
	`{"network":{"rules":{"api.github.test":[{"transform":{"headers":{"Authorization":"Bearer ${e2b.secrets.TOKEN}"}}}]}}}`,
	`{"network":{"rules":{"pkg.test":[{"transform":{"headers":{"X-K":"${secret:GRANTED}"}}}]}}}`,
	`{"network":{"rules":{"pkg.test":[{"transform":{"headers":{"X-K":"${secret:BAD"}}}]}}}`,
	`{"network":"nope"}`, `{"network":{"allowOut":[1]}}`, `{"secretEnvVars":{"TOKEN":"TOKEN"}}`,
	`{"volumeMounts":[{"name":"data","path":"/mnt/data"},{"name":"data","path":"/mnt/data"}]}`,
	`{"volumeMounts":[{"name":"data","path":"/run"}]}`, `{"volumeMounts":{"name":"x"}}`,
	`{"lifecycle":{"autoStop":"15m","autoArchiveDays":1.5,"autoDeleteSeconds":0,"onTimeout":"pause","autoResume":true}}`,
	`{"lifecycle":{"autoStop":"15m","autoStopSeconds":60}}`, `{"lifecycle":{"autoArchiveDays":1e300}}`,
	`{"lifecycle":{"unknown":1}}`, `{"lifecycle":{"onTimeout":"explode"}}`, `{"lifecycle":{"autoStop":"-5m"}}`,
	`{"autoResume":{"enabled":true},"autoPause":true,"autoPauseMemory":false,"secure":true,"mcp":{"x":1}}`,
	`{"timeout":"60"}`, `{"metadata":{"a":1}}`, `{"templateID":"../../etc"}`, `{"templateID":"` + strings.Repeat("x", 70) + `"}`,
}

// FuzzCreateSandboxBody: POST /sandboxes and /v2/sandboxes as the admin or
// as a team's key. The options it gives, once normalized as Manager.Create
// does first, hold the requested timeout exactly, an egress policy within
// the key's ceiling, only secrets the key may use, valid volume mounts and
// lifecycle, and a traffic token exactly when public traffic was refused.
func FuzzCreateSandboxBody(f *testing.F) {
	for _, s := range createSeeds {
		f.Add([]byte(s), false, false)
		f.Add([]byte(s), true, true)
	}
	s := fuzzServer()
	defaults := sandbox.Lifecycle{AutoStop: 15 * time.Minute}
	max, err := sandbox.Maxima{}.Resolve(f.TempDir()) // the daemon's default: the host's
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte, v1, admin bool) {
		path := "/v2/sandboxes"
		if v1 {
			path = "/sandboxes"
		}
		p := fuzzPrincipal(admin)
		opts, err := s.createOptions(fuzzRequest("POST", path, body, p), defaults)
		if err != nil {
			want4xx(t, "createOptions", err)
			return
		}
		if err := opts.Normalize(max); err != nil {
			want4xx(t, "Normalize", err)
			return
		}
		var asked struct {
			Timeout *json.Number `json:"timeout"`
			Network struct {
				AllowPublicTraffic *bool `json:"allowPublicTraffic"`
			} `json:"network"`
		}
		_ = json.Unmarshal(body, &asked)
		if asked.Timeout != nil {
			// In seconds: multiplying n out could overflow as the code did.
			if n, err := asked.Timeout.Int64(); err == nil && n > 0 && (opts.Timeout%time.Second != 0 || int64(opts.Timeout/time.Second) != n) {
				t.Fatalf("timeout %d s became %v", n, opts.Timeout)
			}
		}
		if opts.Egress == nil {
			t.Fatal("a daemon with a ceiling created a sandbox without an egress policy")
		}
		if err := opts.Egress.Validate(); err != nil {
			t.Fatalf("invalid egress policy %+v: %v", opts.Egress, err)
		}
		allowedWithin(t, "create", opts.Egress, *p.Ceiling)
		checkSecretsAllowed(t, opts.Egress, p)
		for _, name := range opts.SecretEnv {
			if !p.MayUseSecret(name) {
				t.Fatalf("secretEnvVars names %q, which the key may not use", name)
			}
		}
		if err := sandbox.ValidateVolumeMounts(opts.Volumes); err != nil {
			t.Fatalf("volume mounts %+v accepted: %v", opts.Volumes, err)
		}
		refused := asked.Network.AllowPublicTraffic != nil && !*asked.Network.AllowPublicTraffic
		if (opts.TrafficAccessToken != "") != refused {
			t.Fatalf("traffic token %q for allowPublicTraffic %v", opts.TrafficAccessToken, asked.Network.AllowPublicTraffic)
		}
	})
}

func checkSecretsAllowed(t *testing.T, p *egress.Policy, who tenant.Principal) {
	t.Helper()
	for host, rules := range p.Rules {
		for _, r := range rules {
			if r.Transform == nil {
				continue
			}
			for h, v := range r.Transform.Headers {
				names, err := secrets.Names(v)
				if err != nil {
					t.Fatalf("rules[%q] header %q: malformed placeholder accepted: %v", host, h, err)
				}
				for _, n := range names {
					if !who.MayUseSecret(n) {
						t.Fatalf("rules[%q] header %q uses secret %q, which the key may not use", host, h, n)
					}
				}
			}
		}
	}
}

// FuzzSandboxBodies feeds one body to every route that reads a small body:
// POST /sandboxes/{id}/timeout, /refreshes, /connect, /pause, /resume,
// /fork, /snapshots, /wait, PUT /pools/{template} and POST /volumes.
func FuzzSandboxBodies(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `null`, `[]`, `"x"`, `{"timeout":30}`, `{"timeout":-1}`, `{"timeout":9223372037}`, `{"timeout":18446744074}`,
		`{"timeout":1e3}`, `{"timeout":"30"}`, `{"timeout":30.5}`, `{"duration":120}`, `{"duration":-5}`,
		`{"timeout":10,"memory":false}`, `{"memory":true}`, `{"memory":"no"}`, `{"count":3,"timeout":60}`,
		`{"count":0}`, `{"count":33}`, `{"count":2147483648}`, `{"name":"snap-1"}`, `{"name":7}`, `{"size":2}`,
		`{"size":-1}`, `{"size":null}`, `{"name":"data","sizeMB":1024}`, `{"name":"data","size":"2G"}`,
		`{"name":"data","size":"2G","sizeMB":1}`, `{"name":"data","sizeMB":1099511627777}`, `{"name":"data","size":"9223372036854775807T"}`,
		`{"port":8080}`, `{"port":70000}`, `{"port":-1}`, `{"log":"ready","pid":12}`, `{"log":"ready"}`,
		`{"port":1,"log":"x","pid":1}`, `{"port":80,"timeout":"10s"}`, `{"port":80,"timeout":1e300}`,
		`{"port":80,"timeout":-1e300}`, `{"port":80,"timeout":"100000h"}`, `{"port":80,"timeout":3600.0000001}`,
		strings.Repeat(" ", 1<<20+1),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req := func() *http.Request { return fuzzRequest("POST", "/x", body, fuzzPrincipal(false)) }
		durations := map[string]func() (time.Duration, error){
			"timeout":   func() (time.Duration, error) { return parseSetTimeout(req()) },
			"refreshes": func() (time.Duration, error) { return parseRefresh(req()) },
			"resume":    func() (time.Duration, error) { return parseResume(req()) },
			"connect": func() (time.Duration, error) {
				d, _, err := parseConnect(req())
				return d, err
			},
		}
		for route, parse := range durations {
			d, err := parse()
			if err != nil {
				want4xx(t, route, err)
			} else if d < 0 {
				t.Fatalf("%s: negative duration %v", route, d)
			}
		}
		if _, err := parsePause(req()); err != nil {
			want4xx(t, "pause", err)
		}
		if n, d, err := parseFork(req()); err != nil {
			want4xx(t, "fork", err)
		} else if n < 1 || n > sandbox.MaxForkCount || d < 0 {
			t.Fatalf("fork: count %d, timeout %v", n, d)
		}
		if _, err := parseSnapshot(req()); err != nil {
			want4xx(t, "snapshots", err)
		}
		if _, err := parsePoolSize(req()); err != nil {
			want4xx(t, "pools", err)
		}
		if _, size, err := parseVolumeCreate(req()); err != nil {
			want4xx(t, "volumes", err)
		} else if size < 0 {
			t.Fatalf("volumes: size %d", size)
		}
		if q, err := parseWait(req()); err != nil {
			want4xx(t, "wait", err)
		} else {
			d, err := time.ParseDuration(q.Get("timeout"))
			if err != nil || d <= 0 || d > maxWaitTimeout {
				t.Fatalf("wait: timeout %q", q.Get("timeout"))
			}
			if (q.Get("port") != "") == (q.Get("log") != "") {
				t.Fatalf("wait: %v is not one port or one log line", q)
			}
		}
	})
}

// FuzzNetworkUpdate: PUT /sandboxes/{id}/network over a stored network
// object. The new policy is within the key's ceiling and uses only secrets
// the key may; the stored object keeps its non-egress fields.
func FuzzNetworkUpdate(f *testing.F) {
	for _, s := range [][2]string{
		{`{"allowOut":["pkg.test"]}`, `{"allowPublicTraffic":false,"allowOut":["x.test"],"maskRequestHost":"h"}`},
		{`{}`, ``}, {``, `null`}, {`{"denyOut":["0.0.0.0/0"],"allow_internet_access":false}`, `[1]`},
		{`{"allowOut":["evil.test"]}`, `{}`}, {`{"allowOut":["not a host"]}`, `{}`},
		{`{"rules":{"pkg.test":[{"transform":{"headers":{"A":"${secret:NOPE}"}}}]}}`, `{}`},
		{`{"rules":{"pkg.test":[{"transform":{"headers":{"A":"${secret:GRANTED}"}}}]}}`, `{"rules":{"old.test":[]}}`},
		{`{"allowOut":"pkg.test"}`, `"str"`},
	} {
		f.Add([]byte(s[0]), []byte(s[1]), false)
		f.Add([]byte(s[0]), []byte(s[1]), true)
	}
	s := fuzzServer()
	f.Fuzz(func(t *testing.T, body, stored []byte, admin bool) {
		p := fuzzPrincipal(admin)
		pol, merged, _, err := s.parseNetworkUpdate(fuzzRequest("PUT", "/sandboxes/x/network", body, p), stored)
		if err != nil {
			want4xx(t, "network", err)
			return
		}
		if err := pol.Validate(); err != nil {
			t.Fatalf("invalid policy %+v: %v", pol, err)
		}
		allowedWithin(t, "network", pol, *p.Ceiling)
		checkSecretsAllowed(t, pol, p)
		var old, now map[string]json.RawMessage
		if merged != nil && json.Unmarshal(merged, &now) != nil {
			t.Fatalf("merged network %q is not a JSON object", merged)
		}
		if json.Unmarshal(stored, &old) == nil {
			for k, v := range old {
				if k == "allowOut" || k == "denyOut" || k == "rules" {
					continue
				}
				if !bytes.Equal(now[k], v) {
					t.Fatalf("stored field %q = %s became %s", k, v, now[k])
				}
			}
		}
		if tok := trafficTokenFor(merged); tok != "" && !regexp.MustCompile(`^[0-9a-f]{48}$`).MatchString(tok) {
			t.Fatalf("traffic token %q", tok)
		}
	})
}

// FuzzKeyBody: POST /keys (admin only): a key's name, team, budget,
// secrets and egress list are checked, its egress within the daemon's
// ceiling; a malformed entry is bad input (400), one outside the ceiling a
// refusal (403).
func FuzzKeyBody(f *testing.F) {
	for _, s := range []string{
		`{"name":"ci-bot"}`, `{"name":"ci-bot","team":"devs","mcpMaxCalls":10,"egressAllow":["pkg.test"],"secrets":["A","*"]}`,
		`{"name":""}`, `{"name":"-x"}`, `{"name":"a","team":"Devs"}`, `{"name":"a","team":"admin"}`,
		`{"name":"a","mcpMaxCalls":-1}`, `{"name":"a","secrets":["bad name"]}`, `{"name":"a","egressAllow":["evil.test"]}`,
		`{"name":"a","egressAllow":["not a host"]}`, `{"name":"a","egressAllow":["169.254.169.254"]}`, `{"name":1}`,
	} {
		f.Add([]byte(s))
	}
	s := fuzzServer()
	f.Fuzz(func(t *testing.T, body []byte) {
		nk, err := s.parseKeyCreate(fuzzRequest("POST", "/keys", body, fuzzPrincipal(true)))
		if err != nil {
			want4xx(t, "keys", err)
			var req struct {
				EgressAllow []string `json:"egressAllow"`
			}
			if json.Unmarshal(body, &req) == nil && errdefs.Is(err, errdefs.KindForbidden) {
				if verr := (egress.Policy{AllowOut: req.EgressAllow}).Validate(); verr != nil {
					t.Fatalf("a malformed egressAllow (%v) answered 403: %v", verr, err)
				}
			}
			return
		}
		if !keyNameRe.MatchString(nk.Name) || nk.MCPMaxCalls < 0 {
			t.Fatalf("accepted key %+v", nk)
		}
		if len(nk.EgressAllow) > 0 {
			allowedWithin(t, "keys", &egress.Policy{AllowOut: nk.EgressAllow}, fuzzCeiling)
		}
	})
}

// FuzzQueries feeds one query string to every query parser: GET
// /v2/sandboxes (and the v1 metadata filter), /snapshots, /secrets,
// /sandboxes/{id}/metrics, /sandboxes/{id}/logs (v1 and v2) and the PTY's.
func FuzzQueries(f *testing.F) {
	for _, s := range []string{
		"", "metadata=a%3Db%26c%3Dd&state=running,paused&limit=10&order=asc&startedAfter=2024-01-01T00:00:00Z&nextToken=1700000000000000000_abc",
		"state=bogus", "limit=0", "limit=101", "order=sideways", "nextToken=x", "nextToken=12_", "metadata=%zz", "metadata=a%253Db",
		"limit=5&nextToken=10", "nextToken=-1", "nextToken=" + strings.Repeat("A", 40), "nextToken=!!",
		"start=100&end=50", "start=-1", "end=9223372036854775807", "start=1700000000&end=1700000100",
		"since=2024-01-01T00:00:00Z&start=1", "cursor=1700000000000&direction=backward&kind=connect,dns&decision=blocked&limit=10000",
		"direction=sideways", "kind=nope", "decision=maybe", "limit=10001",
		"offset=-1", "cols=0", "rows=65536", "cols=200&rows=50&offset=1024",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		if lq, err := parseListQuery(q); err != nil {
			want4xx(t, "list", err)
		} else if lq.limit < 1 || lq.limit > 100 || len(lq.states) == 0 && q.Get("state") == "" {
			t.Fatalf("list query %+v", lq)
		}
		if _, err := parseMetadataFilter(q.Get("metadata")); err != nil {
			want4xx(t, "metadata", err)
		}
		if limit, offset, err := parseSnapshotPage(q); err != nil {
			want4xx(t, "snapshots", err)
		} else if limit < 1 || limit > maxSnapshotPage || offset < 0 {
			t.Fatalf("snapshot page %d, %d", limit, offset)
		}
		if limit, _, err := parseSecretPage(q); err != nil {
			want4xx(t, "secrets", err)
		} else if limit < 1 || limit > maxSecretPage {
			t.Fatalf("secret page %d", limit)
		}
		if start, end, err := parseMetricsWindow(q); err != nil {
			want4xx(t, "metrics", err)
		} else if !start.IsZero() && !end.IsZero() && end.Before(start) {
			t.Fatalf("metrics window %v .. %v", start, end)
		}
		r := httptest.NewRequest("GET", "/x?"+q.Encode(), nil)
		for _, v2 := range []bool{false, true} {
			if lq, _, err := parseLogQuery(r, v2); err != nil {
				want4xx(t, "logs", err)
			} else if lq.Limit < 1 || lq.Limit > maxLogLimit {
				t.Fatalf("log limit %d", lq.Limit)
			}
		}
		if offset, cols, rows, err := parsePTYQuery(r); err != nil {
			want4xx(t, "pty", err)
		} else if offset < 0 || cols == 0 || rows == 0 || cols > edge.MaxPTYSize || rows > edge.MaxPTYSize {
			t.Fatalf("pty %d %dx%d", offset, cols, rows)
		}
	})
}
