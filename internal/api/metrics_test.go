package api_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// scrape reads /metrics with the admin key and parses it with Prometheus'
// own text parser.
func (a apiT) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	st, _, body := a.do(t, "GET", "/metrics", a.env.APIKey, nil, nil)
	if st != 200 {
		t.Fatalf("GET /metrics: %d %s", st, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return fams
}

// labelsMatch reports whether m has every label of want.
func labelsMatch(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// sumSeries adds up value over the series of name with the labels want.
func sumSeries(fams map[string]*dto.MetricFamily, name string, want map[string]string, value func(*dto.Metric) float64) float64 {
	var v float64
	for _, m := range fams[name].GetMetric() {
		if labelsMatch(m, want) {
			v += value(m)
		}
	}
	return v
}

// histCount is the sample count of a histogram's series.
func histCount(fams map[string]*dto.MetricFamily, name string, want map[string]string) uint64 {
	return uint64(sumSeries(fams, name, want, func(m *dto.Metric) float64 { return float64(m.GetHistogram().GetSampleCount()) }))
}

func counterValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	return sumSeries(fams, name, want, func(m *dto.Metric) float64 { return m.GetCounter().GetValue() })
}

// TestLifecycleMetrics does every lifecycle operation a known number of
// times on a real daemon and scrapes /metrics: each histogram's count is the
// number of operations done, each death is counted under its cause, an API
// error under its route pattern (never a sandbox ID) and status.
func TestLifecycleMetrics(t *testing.T) {
	env := daemontest.Start(t, runtime.Namespaces, daemontest.Options{})
	a := apiT{env: env}
	c := env.Client
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rt := map[string]string{"runtime": runtime.Namespaces, "template": "base"}
	with := func(k, v string) map[string]string {
		m := map[string]string{k: v}
		for k, v := range rt {
			m[k] = v
		}
		return m
	}

	// Two cold creates, one exec, a pause and a resume, a snapshot.
	var ids []string
	for range 2 {
		sb, err := c.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: new(int64(300))})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.SandboxID)
	}
	conn, err := c.Sandbox(ctx, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if res, err := conn.Exec(ctx, "echo hi", client.ExecOptions{}); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if err := c.Pause(ctx, ids[1], true); err != nil {
		t.Fatal(err)
	}
	if _, resumed, err := c.ConnectResumed(ctx, ids[1]); err != nil || !resumed {
		t.Fatalf("resume: %v %v", resumed, err)
	}
	snap, err := c.Snapshot(ctx, ids[0], "")
	if err != nil {
		t.Fatal(err)
	}
	// A create from the snapshot, and one fork request of two.
	fromSnap, err := c.Create(ctx, client.CreateRequest{TemplateID: snap.SnapshotID, Timeout: new(int64(300))})
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, fromSnap.SandboxID)
	forks, err := c.Fork(ctx, ids[0], 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		if f.Sandbox == nil {
			t.Fatalf("fork failed: %+v", f.Error)
		}
		ids = append(ids, f.Sandbox.SandboxID)
	}
	// A sandbox that times out (a cold create too).
	short, err := c.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: new(int64(1))})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := c.Get(ctx, short.SandboxID); client.IsNotFound(err) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the 1 s sandbox was never reaped")
		case <-time.After(100 * time.Millisecond):
		}
	}
	// An API error on a route with a sandbox ID in it.
	if st, _, _ := a.do(t, "GET", "/sandboxes/nosuchsandboxnosuch0", env.APIKey, nil, nil); st != 404 {
		t.Fatalf("unknown sandbox: %d", st)
	}
	// Kill all but one: each a "killed" death.
	for _, id := range ids[1:] {
		if err := c.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// A pooled create.
	if _, err := c.SetPool(ctx, "base", 1); err != nil {
		t.Fatal(err)
	}
	for {
		ps, err := c.ListPools(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) == 1 && ps[0].Ready == 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the pool never filled: %+v", ps)
		case <-time.After(100 * time.Millisecond):
		}
	}
	pooled, err := c.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: new(int64(300))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(context.WithoutCancel(ctx), pooled.SandboxID)
	defer c.Kill(context.WithoutCancel(ctx), ids[0])
	if _, err := c.SetPool(ctx, "base", 0); err != nil {
		t.Fatal(err)
	}

	fams := a.scrape(t)
	for _, h := range []struct {
		name   string
		labels map[string]string
		want   uint64
	}{
		{"cella_sandbox_create_duration_seconds", with("kind", "cold"), 3},
		{"cella_sandbox_create_duration_seconds", with("kind", "snapshot"), 1},
		{"cella_sandbox_create_duration_seconds", with("kind", "pooled"), 1},
		{"cella_exec_start_duration_seconds", rt, 1},
		{"cella_sandbox_pause_duration_seconds", rt, 1},
		{"cella_sandbox_resume_duration_seconds", rt, 1},
		{"cella_sandbox_snapshot_duration_seconds", rt, 1},
		{"cella_sandbox_fork_duration_seconds", rt, 1},
	} {
		if got := histCount(fams, h.name, h.labels); got != h.want {
			t.Errorf("%s%v: count %d, want %d", h.name, h.labels, got, h.want)
		}
	}
	for cause, want := range map[string]float64{"killed": float64(len(ids) - 1), "timeout": 1, "oom": 0, "pids": 0, "crash": 0} {
		if got := counterValue(fams, "cella_sandbox_deaths_total", map[string]string{"cause": cause, "runtime": runtime.Namespaces}); got != want {
			t.Errorf("deaths{cause=%s}: %v, want %v", cause, got, want)
		}
	}
	// The poll for the reaped sandbox ended on its first 404; then the
	// unknown one.
	if got := counterValue(fams, "cella_api_errors_total", map[string]string{"route": "GET /sandboxes/{id}", "status": "404"}); got != 2 {
		t.Errorf("api errors{GET /sandboxes/{id},404}: %v, want 2", got)
	}
	for _, m := range fams["cella_api_errors_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if strings.Contains(l.GetValue(), "nosuchsandbox") {
				t.Errorf("a raw path in an API error label: %s", fmt.Sprint(m))
			}
		}
	}
}
