package api_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// A burst of creates beyond a warm pool all succeed (the cold ones queue
// for their turn instead of failing or stampeding the runtime), and the
// pool then grows toward that burst while its set size stays what it was.
func TestPoolGrowsTowardDemand(t *testing.T) {
	env := daemontest.Start(t, runtime.Namespaces, daemontest.Options{})
	a := apiT{env: env}
	key := env.APIKey
	if st, _, body := a.do(t, "PUT", "/pools/base", key, map[string]any{"size": 1}, nil); st != 200 {
		t.Fatalf("PUT /pools/base: %d %s", st, body)
	}
	a.waitPool(t, "base", 1)

	const burst = 6
	var mu sync.Mutex
	var ids []string
	var wg sync.WaitGroup
	for range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, _, body := a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "base"}, nil)
			if st != 201 {
				t.Errorf("create in a burst: %d %s", st, body)
				return
			}
			var sb struct {
				SandboxID string `json:"sandboxID"`
			}
			json.Unmarshal(body, &sb)
			mu.Lock()
			ids = append(ids, sb.SandboxID)
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, id := range ids {
			_ = env.Client.Kill(context.Background(), id)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	// The pool grows beyond its set size toward the burst, never past it
	// (how many of the six arrived within one second decides how far).
	deadline := time.Now().Add(3 * time.Minute)
	for {
		p := a.pools(t)["base"]
		if p.Ready+p.Filling > burst || p.Size != 1 {
			t.Fatalf("the pool grew past the burst of %d or its set size changed: %+v", burst, p)
		}
		if p.Ready >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool did not grow toward a burst of %d: %+v", burst, p)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
