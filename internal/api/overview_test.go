package api_test

import (
	"encoding/json"
	"testing"

	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// overviewBody is GET /overview as the console reads it.
type overviewBody struct {
	Sandboxes map[string]int `json:"sandboxes"`
	Memory    struct {
		CommittedMB, UsedMB, HostMB, MaxMB int64
	} `json:"memory"`
	Creates struct {
		Start     int64 `json:"start"`
		PerMinute []int `json:"perMinute"`
	} `json:"creates"`
}

func (a apiT) overview(t *testing.T) overviewBody {
	t.Helper()
	st, _, body := a.do(t, "GET", "/overview", a.env.APIKey, nil, nil)
	if st != 200 {
		t.Fatalf("GET /overview: %d %s", st, body)
	}
	var o overviewBody
	if err := json.Unmarshal(body, &o); err != nil {
		t.Fatalf("GET /overview: %v: %s", err, body)
	}
	return o
}

// TestOverview: GET /overview counts a real daemon's sandboxes by state,
// the memory ceilings of the running ones (a paused one commits none) and
// their use, and every create and fork in the last hour's minutes.
func TestOverview(t *testing.T) {
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{})
	a := apiT{env: env}
	o := a.overview(t)
	if o.Sandboxes["running"] != 0 || o.Sandboxes["paused"] != 0 || o.Memory.CommittedMB != 0 || sum(o.Creates.PerMinute) != 0 {
		t.Fatalf("an empty daemon: %+v", o)
	}
	if len(o.Creates.PerMinute) != 60 || o.Memory.HostMB <= 0 || o.Memory.MaxMB <= 0 {
		t.Fatalf("shape: %+v", o)
	}
	ids, _ := createMany(t, env, []map[string]any{{"templateID": "base", "memoryMB": 384}, {"templateID": "base", "memoryMB": 256}})
	o = a.overview(t)
	if o.Sandboxes["running"] != 2 || o.Memory.CommittedMB != 384+256 || o.Memory.UsedMB <= 0 || sum(o.Creates.PerMinute) != 2 {
		t.Fatalf("two sandboxes of 384 and 256 MiB: %+v", o)
	}
	if st, _, body := a.do(t, "POST", "/sandboxes/"+ids[1]+"/pause", env.APIKey, map[string]any{}, nil); st != 204 {
		t.Fatalf("pause: %d %s", st, body)
	}
	if st, _, body := a.do(t, "POST", "/sandboxes/"+ids[0]+"/fork", env.APIKey, map[string]any{"count": 1}, nil); st != 201 {
		t.Fatalf("fork: %d %s", st, body)
	}
	o = a.overview(t)
	if o.Sandboxes["running"] != 2 || o.Sandboxes["paused"] != 1 || o.Memory.CommittedMB != 384+384 || sum(o.Creates.PerMinute) != 3 {
		t.Fatalf("one paused, one forked from the 384 MiB one: %+v", o)
	}
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}
