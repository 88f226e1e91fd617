package api_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// want429 checks a quota refusal: E2B's error shape and nothing else, a
// message naming the limit, its value and the command that raises it, and
// Retry-After only for rates.
func want429(t *testing.T, st int, hdr map[string][]string, body []byte, limit, value, raise string, rate bool) {
	t.Helper()
	if st != 429 {
		t.Fatalf("want 429 for %s, got %d %s", limit, st, body)
	}
	var e map[string]any
	if err := json.Unmarshal(body, &e); err != nil || len(e) != 2 || e["code"] != float64(429) {
		t.Fatalf("429 body is not E2B's {code, message}: %s", body)
	}
	msg, _ := e["message"].(string)
	for _, s := range []string{limit, value, raise} {
		if !strings.Contains(msg, s) {
			t.Fatalf("429 message %q does not name %q", msg, s)
		}
	}
	ra := hdr["Retry-After"]
	if rate {
		if n, err := strconv.Atoi(strings.Join(ra, "")); err != nil || n < 1 {
			t.Fatalf("a rate limit's 429 without a Retry-After in seconds: %q", ra)
		}
	} else if len(ra) != 0 {
		t.Fatalf("a limit that waiting does not lift has Retry-After %q", ra)
	}
}

// TestKeyQuotas: concurrent creates of one key over real HTTP — exactly
// the limit succeed, the rest are 429 naming the limit; a paused sandbox
// frees its slot and its resume takes one again; a fork, a failed create, a
// kill; vCPU and memory totals; create and request rates with Retry-After;
// the admin key is unlimited and has no quota to set.
func TestKeyQuotas(t *testing.T) {
	env := daemontest.Start(t, runtime.Namespaces, daemontest.Options{})
	a := apiT{env: env}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	newKey := func(body map[string]any) client.Key {
		t.Helper()
		st, _, b := a.do(t, "POST", "/keys", env.APIKey, body, nil)
		if st != 201 {
			t.Fatalf("POST /keys %v: %d %s", body, st, b)
		}
		var k client.Key
		json.Unmarshal(b, &k)
		return k
	}
	var mu sync.Mutex
	var made []string
	create := func(key string, body map[string]any) (int, map[string][]string, []byte) {
		if body == nil {
			body = map[string]any{"templateID": "base"}
		}
		st, hdr, b := a.do(t, "POST", "/v2/sandboxes", key, body, nil)
		if st == 201 {
			var sb client.Sandbox
			json.Unmarshal(b, &sb)
			mu.Lock()
			made = append(made, sb.SandboxID)
			mu.Unlock()
		}
		return st, hdr, b
	}
	defer func() {
		for _, id := range made {
			env.Client.Kill(context.WithoutCancel(ctx), id)
		}
	}()
	self := func(key string) client.Key {
		t.Helper()
		st, _, b := a.do(t, "GET", "/keys/self", key, nil, nil)
		if st != 200 {
			t.Fatalf("GET /keys/self: %d %s", st, b)
		}
		var k client.Key
		json.Unmarshal(b, &k)
		return k
	}

	q := newKey(map[string]any{"name": "q", "maxSandboxes": 3})
	if k := self(q.Key); k.MaxSandboxes != 3 || k.MaxVCPUs != 0 || k.CreateRate != "" || k.Usage.Sandboxes != 0 {
		t.Fatalf("GET /keys/self of a new key: %+v", k)
	}
	// 8 creates at once: exactly 3 succeed.
	const n = 8
	sts := make([]int, n)
	bodies := make([][]byte, n)
	hdrs := make([]map[string][]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sts[i], hdrs[i], bodies[i] = create(q.Key, nil)
		}()
	}
	wg.Wait()
	ok := 0
	for i, st := range sts {
		if st == 201 {
			ok++
			continue
		}
		want429(t, st, hdrs[i], bodies[i], "maxSandboxes", "limit of 3", "cella key update q --max-sandboxes N", false)
	}
	if ok != 3 {
		t.Fatalf("%d of %d concurrent creates succeeded with maxSandboxes 3: %v", ok, n, sts)
	}
	if k := self(q.Key); k.Usage.Sandboxes != 3 || k.Usage.VCPUs != 3 || k.Usage.MemoryMB != 3*512 {
		t.Fatalf("usage at the limit: %+v", k.Usage)
	}
	qc, err := client.New(client.Config{URL: env.URL, APIKey: q.Key})
	if err != nil {
		t.Fatal(err)
	}
	// A paused sandbox holds no slot; resuming it needs one.
	paused := made[0]
	if err := qc.Pause(ctx, paused, true); err != nil {
		t.Fatal(err)
	}
	if st, _, b := create(q.Key, nil); st != 201 {
		t.Fatalf("create after a pause: %d %s", st, b)
	}
	st, hdr, b := a.do(t, "POST", "/sandboxes/"+paused+"/connect", q.Key, map[string]any{"timeout": 300}, nil)
	want429(t, st, hdr, b, "maxSandboxes", "limit of 3", "--max-sandboxes", false)
	// All forks fit or none is made (and nothing is snapshotted).
	st, hdr, b = a.do(t, "POST", "/sandboxes/"+made[1]+"/fork", q.Key, map[string]any{"count": 1}, nil)
	want429(t, st, hdr, b, "maxSandboxes", "limit of 3", "--max-sandboxes", false)
	// A kill frees a slot: the paused one resumes.
	if err := qc.Kill(ctx, made[1]); err != nil {
		t.Fatal(err)
	}
	if st, _, b := a.do(t, "POST", "/sandboxes/"+paused+"/connect", q.Key, map[string]any{"timeout": 300}, nil); st != 201 {
		t.Fatalf("resume after a kill: %d %s", st, b)
	}
	// Raised to 4: a create that fails gives its slot back.
	st, _, b = a.do(t, "PATCH", "/keys/q", env.APIKey, map[string]any{"maxSandboxes": 4}, nil)
	if st != 200 {
		t.Fatalf("PATCH /keys/q: %d %s", st, b)
	}
	if st, _, b := create(q.Key, map[string]any{"templateID": "no-such-template"}); st != 404 {
		t.Fatalf("create of an unknown template: %d %s", st, b)
	}
	if st, _, b := create(q.Key, nil); st != 201 {
		t.Fatalf("create after a failed one: %d %s", st, b)
	}
	st, hdr, b = create(q.Key, nil)
	want429(t, st, hdr, b, "maxSandboxes", "limit of 4", "--max-sandboxes", false)

	// vCPUs and memory of running sandboxes together.
	r := newKey(map[string]any{"name": "res", "maxVcpus": 2, "maxMemoryMB": 1024})
	if st, _, b := create(r.Key, map[string]any{"templateID": "base", "cpuCount": 2, "memoryMB": 256}); st != 201 {
		t.Fatalf("create of 2 vCPUs: %d %s", st, b)
	}
	st, hdr, b = create(r.Key, map[string]any{"templateID": "base", "cpuCount": 1, "memoryMB": 256})
	want429(t, st, hdr, b, "maxVcpus", "limit of 2 vCPUs", "cella key update res --max-vcpus N", false)
	st, _, b = a.do(t, "PATCH", "/keys/res", env.APIKey, map[string]any{"maxVcpus": 0}, nil)
	if st != 200 {
		t.Fatalf("PATCH: %d %s", st, b)
	}
	if st, _, b := create(r.Key, map[string]any{"templateID": "base", "cpuCount": 1, "memoryMB": 768}); st != 201 {
		t.Fatalf("create up to the memory limit: %d %s", st, b)
	}
	st, hdr, b = create(r.Key, map[string]any{"templateID": "base", "cpuCount": 1, "memoryMB": 256})
	want429(t, st, hdr, b, "maxMemoryMB", "limit of 1024 MiB", "cella key update res --max-memory SIZE", false)

	// Rates: N at once, then Retry-After; a refused request takes nothing.
	cr := newKey(map[string]any{"name": "cr", "createRate": "2/h"})
	for range 2 {
		if st, _, b := create(cr.Key, nil); st != 201 {
			t.Fatalf("create within the rate: %d %s", st, b)
		}
	}
	st, hdr, b = create(cr.Key, nil)
	want429(t, st, hdr, b, "createRate", "2/h", "cella key update cr --create-rate N/h", true)
	rr := newKey(map[string]any{"name": "rr", "requestRate": "3/h"})
	for range 3 {
		self(rr.Key)
	}
	st, hdr, b = a.do(t, "GET", "/keys/self", rr.Key, nil, nil)
	want429(t, st, hdr, b, "requestRate", "3/h", "cella key update rr --request-rate N/h", true)
	st, hdr, b = a.do(t, "GET", "/v2/sandboxes", rr.Key, nil, nil)
	want429(t, st, hdr, b, "requestRate", "3/h", "--request-rate", true)

	// The admin key: unlimited, and no quota to set.
	if st, _, b := a.do(t, "PATCH", "/keys/admin", env.APIKey, map[string]any{"maxSandboxes": 1}, nil); st != 400 || !strings.Contains(string(b), "unlimited") {
		t.Fatalf("a quota on the admin key: %d %s", st, b)
	}
	// Bad values name the field.
	for body, field := range map[string]string{`{"maxSandboxes":-1}`: "maxSandboxes", `{"createRate":"5/fortnight"}`: "createRate", `{"requestRate":"x"}`: "requestRate"} {
		if st, _, b := a.do(t, "PATCH", "/keys/q", env.APIKey, body, nil); st != 400 || !strings.Contains(string(b), field) {
			t.Fatalf("PATCH %s: %d %s", body, st, b)
		}
	}
	// The refusals are counted by limit.
	fams := a.scrape(t)
	for limit, want := range map[string]float64{"maxSandboxes": 5 + 1 + 1 + 1, "maxVcpus": 1, "maxMemoryMB": 1, "createRate": 1, "requestRate": 2} {
		if got := counterValue(fams, "cella_quota_rejections_total", map[string]string{"limit": limit}); got != want {
			t.Errorf("quota rejections{%s}: %v, want %v", limit, got, want)
		}
	}
}
