package api_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/audit"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// TestOverviewEgress: the host overview's egress figures are the egress
// proxy's decisions, allowed and blocked, one for one with the audit log's
// (a real sandbox reaching an allowed upstream on loopback, and refused
// another name and a Host it may not reach).
func TestOverviewEgress(t *testing.T) {
	up := newUpstreams(t, nil, nil)
	env := daemontest.Start(t, runtime.Namespaces, daemontest.Options{Network: daemon.NetworkConfig{
		Allow: []string{"allowed.test"}, Resolve: []string{"*.test=127.0.0.1"},
	}})
	a := apiT{env: env}
	egress := func() (allowed, blocked int64) {
		t.Helper()
		st, _, body := a.do(t, "GET", "/overview", env.APIKey, nil, nil)
		var o struct {
			Egress *struct{ Allowed, Blocked int64 } `json:"egress"`
		}
		if st != 200 || json.Unmarshal(body, &o) != nil || o.Egress == nil {
			t.Fatalf("GET /overview: %d %s", st, body)
		}
		return o.Egress.Allowed, o.Egress.Blocked
	}
	if al, bl := egress(); al != 0 || bl != 0 {
		t.Fatalf("before any traffic: allowed %d blocked %d", al, bl)
	}
	id, sb := mustCreate(t, env, map[string]any{"templateID": "base"})
	for range 2 {
		if res := sh(t, sb, "", fmt.Sprintf("curl -sS -m 10 http://allowed.test:%d/", up.httpPort)); res.ExitCode != 0 {
			t.Fatalf("allowed: %+v", res)
		}
	}
	if res := sh(t, sb, "", fmt.Sprintf("curl -sS -m 10 http://other.test:%d/", up.httpPort)); res.ExitCode != 6 {
		t.Fatalf("a name not allowed: %+v", res)
	}
	if res := sh(t, sb, "", fmt.Sprintf("curl -sS -m 10 -H 'Host: other.test' http://10.1.2.3:%d/", up.httpPort)); res.ExitCode != 0 {
		t.Fatalf("a Host not allowed: %+v", res)
	}
	// The audit log's decisions, counted; the overview must say the same.
	decisions := func() (allowed, blocked int64) {
		st, _, body := a.do(t, "GET", "/sandboxes/"+id+"/logs?kind=connect,dns", env.APIKey, nil, nil)
		var out struct {
			Entries []audit.Entry `json:"entries"`
		}
		if st != 200 || json.Unmarshal(body, &out) != nil {
			t.Fatalf("logs: %d %s", st, body)
		}
		for _, e := range out.Entries {
			switch e.Decision {
			case audit.DecisionBlocked:
				blocked++
			case audit.DecisionAllowed:
				allowed++
			}
		}
		return allowed, blocked
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		al, bl := egress()
		wa, wb := decisions()
		if al == wa && bl == wb && wa >= 2 && wb >= 2 {
			t.Logf("allowed %d, blocked %d", al, bl)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("overview: allowed %d blocked %d; audit log: allowed %d blocked %d (want equal, each at least 2)", al, bl, wa, wb)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
