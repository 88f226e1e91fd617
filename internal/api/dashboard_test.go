package api_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

var (
	metricRe   = regexp.MustCompile(`\b(?:cella|go|process)_[a-zA-Z0-9_]+\b`)
	selectorRe = regexp.MustCompile(`\b((?:cella|go|process)_[a-zA-Z0-9_]+)\{([^}]*)\}`)
	matcherRe  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	byRe       = regexp.MustCompile(`\bby\s*\(([^)]*)\)`)
	labelArgRe = regexp.MustCompile(`label_values\(\s*([a-zA-Z0-9_:]+)\s*,\s*([a-zA-Z0-9_]+)\s*\)`)
)

// dashboardQueries are every PromQL expression of a Grafana dashboard:
// panel targets (rows' nested panels too) and query variables.
func dashboardQueries(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s is not a dashboard: %v", path, err)
	}
	var out []string
	var walk func([]json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, raw := range ps {
			var p struct {
				Title   string            `json:"title"`
				Type    string            `json:"type"`
				Panels  []json.RawMessage `json:"panels"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			}
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatal(err)
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q queries nothing", p.Title)
			}
			for _, tg := range p.Targets {
				out = append(out, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) != nil {
			json.Unmarshal(v.Query, &q.Query)
		}
		out = append(out, q.Query)
	}
	return out
}

// TestGrafanaDashboard: every metric deploy/grafana/cella.json queries, and
// every label it selects or groups by, is in a real daemon's /metrics.
func TestGrafanaDashboard(t *testing.T) {
	queries := dashboardQueries(t, filepath.Join(daemontest.RepoRoot(t), "deploy", "grafana", "cella.json"))
	if len(queries) < 10 {
		t.Fatalf("only %d queries in the dashboard", len(queries))
	}
	env := daemontest.Start(t, runtime.Namespaces, daemontest.Options{Network: daemon.NetworkConfig{Allow: []string{"a.test"}}})
	a := apiT{env: env}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// What makes series exist that do not from the start: a pool, an API error.
	if _, err := env.Client.SetPool(ctx, "base", 1); err != nil {
		t.Fatal(err)
	}
	defer env.Client.SetPool(context.WithoutCancel(ctx), "base", 0)
	a.do(t, "GET", "/sandboxes/nosuchsandboxnosuch0", env.APIKey, nil, nil)
	fams := a.scrape(t)

	// family finds the family a queried name belongs to (a histogram's
	// _bucket, _count and _sum are its own).
	family := func(name string) *dto.MetricFamily {
		if f := fams[name]; f != nil {
			return f
		}
		for _, suf := range []string{"_bucket", "_count", "_sum"} {
			if base, ok := strings.CutSuffix(name, suf); ok {
				if f := fams[base]; f != nil && f.GetType() == dto.MetricType_HISTOGRAM {
					return f
				}
			}
		}
		return nil
	}
	hasLabel := func(f *dto.MetricFamily, label string) bool {
		if label == "le" && f.GetType() == dto.MetricType_HISTOGRAM {
			return true
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					return true
				}
			}
		}
		return false
	}
	for _, q := range queries {
		names := metricRe.FindAllString(q, -1)
		if len(names) == 0 {
			t.Errorf("query %q names no metric", q)
		}
		var used []*dto.MetricFamily
		for _, n := range names {
			f := family(n)
			if f == nil {
				t.Errorf("query %q: %s is not in the daemon's /metrics", q, n)
				continue
			}
			used = append(used, f)
		}
		for _, m := range selectorRe.FindAllStringSubmatch(q, -1) {
			f := family(m[1])
			for _, lm := range matcherRe.FindAllStringSubmatch(m[2], -1) {
				if f != nil && !hasLabel(f, lm[1]) {
					t.Errorf("query %q: %s has no label %q", q, m[1], lm[1])
				}
			}
		}
		for _, m := range byRe.FindAllStringSubmatch(q, -1) {
			for _, label := range strings.Split(m[1], ",") {
				label = strings.TrimSpace(label)
				found := false
				for _, f := range used {
					found = found || hasLabel(f, label)
				}
				if !found {
					t.Errorf("query %q groups by %q, which none of its metrics has", q, label)
				}
			}
		}
		for _, m := range labelArgRe.FindAllStringSubmatch(q, -1) {
			if f := family(m[1]); f != nil && !hasLabel(f, m[2]) {
				t.Errorf("variable query %q: %s has no label %q", q, m[1], m[2])
			}
		}
	}
}
