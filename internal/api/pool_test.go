package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// poolInfo is GET /pools' item, as the client reads it.
type poolInfo = client.Pool

func (a apiT) pools(t *testing.T) map[string]poolInfo {
	t.Helper()
	st, _, body := a.do(t, "GET", "/pools", a.env.APIKey, nil, nil)
	if st != 200 {
		t.Fatalf("GET /pools: %d %s", st, body)
	}
	var ps []poolInfo
	if err := json.Unmarshal(body, &ps); err != nil {
		t.Fatalf("GET /pools: %v: %s", err, body)
	}
	out := map[string]poolInfo{}
	for _, p := range ps {
		out[p.Template] = p
	}
	return out
}

// waitPool waits until the template's pool has at least ready sandboxes
// and no fill in progress (a pool that recent creates grew holds more than
// its size: sandbox/adapt.go).
func (a apiT) waitPool(t *testing.T, tpl string, ready int) poolInfo {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		p := a.pools(t)[tpl]
		if p.Ready >= ready && p.Filling == 0 {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: want %d ready, have %+v", tpl, ready, p)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// poolCreate times a create and the first command in the new sandbox.
func poolCreate(t *testing.T, a apiT, key string, body map[string]any) (id string, create, firstExec time.Duration) {
	t.Helper()
	t0 := time.Now()
	st, _, resp := a.do(t, "POST", "/v2/sandboxes", key, body, nil)
	create = time.Since(t0)
	if st != 201 {
		t.Fatalf("create %v: %d %s", body, st, resp)
	}
	var out struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	json.Unmarshal(resp, &out)
	sb, err := a.env.Client.Sandbox(context.Background(), out.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if res := sh(t, sb, "", "true"); res.ExitCode != 0 {
		t.Fatalf("first command in %s: %+v", out.SandboxID, res)
	}
	firstExec = time.Since(t0)
	t.Cleanup(func() { a.env.Client.Kill(context.Background(), out.SandboxID) })
	return out.SandboxID, create, firstExec
}

// poolDirs is the sandbox directories of a daemon: with no sandbox running,
// its pooled ones.
func poolDirs(t *testing.T, env *daemontest.Env, except ...string) []string {
	var out []string
	for _, d := range sandboxDirs(t, env) {
		if !slices.Contains(except, d) {
			out = append(out, d)
		}
	}
	sort.Strings(out)
	return out
}

func containersOf(t *testing.T, env *daemontest.Env, ids []string) []string {
	t.Helper()
	all, err := env.Daemon.Runtime.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, id := range all {
		if slices.Contains(ids, id) {
			out = append(out, id)
		}
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestPool: warm pools per template — hand-out with the request's env,
// metadata, timeout and egress; refill; fallback to cold for options the
// pool cannot serve; size 0; crash cleanup by reconcile; shutdown; restore
// of the size at restart. Logs warm vs cold create latency.
func TestPool(t *testing.T) {
	// An upstream the request's egress policy allows: the pooled sandbox
	// was made with no egress, so reaching it proves the policy was applied.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "pool-upstream-ok") })}
	go up.Serve(ln)
	t.Cleanup(func() { up.Close() })
	upPort := ln.Addr().(*net.TCPAddr).Port

	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{Network: daemon.NetworkConfig{
		Allow: []string{"allowed.test"}, Resolve: []string{"*.test=127.0.0.1"},
	}})
	a := apiT{env: env}
	key := env.APIKey
	ctx := context.Background()

	if ps := a.pools(t); len(ps) != 0 {
		t.Fatalf("pools before any were set: %v", ps)
	}
	// Only the admin key sizes pools; bad input is refused.
	st, _, body := a.do(t, "POST", "/keys", key, map[string]any{"name": "pool-user"}, nil)
	if st != 201 {
		t.Fatalf("POST /keys: %d %s", st, body)
	}
	var user struct {
		ID  string `json:"id"`
		Key string `json:"key"`
	}
	json.Unmarshal(body, &user)
	st, _, body = a.do(t, "PUT", "/pools/base", user.Key, map[string]any{"size": 2}, nil)
	a.wantError(t, 403, st, body, "admin")
	st, _, body = a.do(t, "PUT", "/pools/base", key, map[string]any{}, nil)
	a.wantError(t, 400, st, body, "size")
	st, _, body = a.do(t, "PUT", "/pools/base", key, map[string]any{"size": -1}, nil)
	a.wantError(t, 400, st, body, "between 0 and")
	st, _, body = a.do(t, "PUT", "/pools/no-such-template", key, map[string]any{"size": 1}, nil)
	a.wantError(t, 404, st, body, "no-such-template")

	t0 := time.Now()
	if st, _, body := a.do(t, "PUT", "/pools/base", key, map[string]any{"size": 2}, nil); st != 200 {
		t.Fatalf("PUT /pools/base: %d %s", st, body)
	}
	a.waitPool(t, "base", 2)
	t.Logf("pool of 2 filled in %v", time.Since(t0).Round(time.Millisecond))
	pooled := poolDirs(t, env)
	if len(pooled) != 2 {
		t.Fatalf("sandbox dirs with a pool of 2 and no sandbox: %v", pooled)
	}

	t.Run("PooledAreHidden", func(t *testing.T) {
		list, err := env.Client.List(ctx)
		if err != nil || len(list) != 0 {
			t.Fatalf("GET /sandboxes lists pooled sandboxes: %v %+v", err, list)
		}
		for _, id := range pooled {
			st, _, body := a.do(t, "GET", "/sandboxes/"+id, key, nil, nil)
			a.wantError(t, 404, st, body, "not found")
			st, _, _ = a.do(t, "GET", "/health", "", nil, map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983"})
			if st == 200 || st == 204 {
				t.Fatalf("the proxy reaches pooled sandbox %s: %d", id, st)
			}
		}
	})

	var warmCreate, warmExec, coldCreate, coldExec []time.Duration
	var handedOut []string
	t.Run("HandOut", func(t *testing.T) {
		id, c, e := poolCreate(t, a, user.Key, map[string]any{
			"templateID": "base", "timeout": 120,
			"envVars":  map[string]string{"POOL_VAR": "from the request", "LANG": "C.UTF-8"},
			"metadata": map[string]string{"who": "pool-test"},
			"network":  map[string]any{"allowOut": []string{"allowed.test"}},
		})
		warmCreate, warmExec = append(warmCreate, c), append(warmExec, e)
		if !slices.Contains(pooled, id) {
			t.Fatalf("create returned %s, not one of the pooled sandboxes %v", id, pooled)
		}
		handedOut = append(handedOut, id)
		sb, err := env.Client.Sandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		res := sh(t, sb, "", fmt.Sprintf(`echo "$POOL_VAR|$E2B_SANDBOX_ID"; curl -sS -m 10 http://allowed.test:%d/`, upPort))
		if res.ExitCode != 0 || res.Stdout != "from the request|"+id+"\npool-upstream-ok" {
			t.Fatalf("command in a pooled sandbox: exit %d stdout %q stderr %q events %q", res.ExitCode, res.Stdout, res.Stderr, res.SandboxEvents)
		}
		d, err := env.Client.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if d.Metadata["who"] != "pool-test" || d.State != "running" || d.MemoryMB != sandbox.DefaultMemoryMB {
			t.Fatalf("detail of a pooled sandbox: %+v", d)
		}
		if got := d.EndAt.Sub(d.StartedAt); got != 120*time.Second {
			t.Fatalf("endAt-startedAt = %v, want the request's 120s", got)
		}
		if age := time.Since(d.StartedAt); age < 0 || age > 30*time.Second {
			t.Fatalf("startedAt of a handed-out sandbox is not its hand-out: %v ago", age)
		}
		if !strings.Contains(string(d.Network), "allowed.test") {
			t.Fatalf("detail network: %s", d.Network)
		}
		live, err := env.Daemon.Manager.Lookup(tenant.System, id)
		if err != nil || live.Options.APIKeyID != user.ID {
			t.Fatalf("handed-out sandbox's API key: %v %q, want %q", err, live.Options.APIKeyID, user.ID)
		}
		list, _ := env.Client.List(ctx)
		if len(list) != 1 || list[0].SandboxID != id {
			t.Fatalf("GET /sandboxes after a hand-out: %+v", list)
		}
		// The refill brings the pool back to 2.
		p := a.waitPool(t, "base", 2)
		if p.HandedOut < 1 || p.Misses != 0 || p.LastError != "" {
			t.Fatalf("pool after a hand-out and refill: %+v", p)
		}
	})

	t.Run("ColdFallback", func(t *testing.T) {
		before := a.pools(t)["base"]
		id, c, e := poolCreate(t, a, key, map[string]any{"templateID": "base", "memoryMB": 1024, "envVars": map[string]string{"POOL_VAR": "cold"}})
		coldCreate, coldExec = append(coldCreate, c), append(coldExec, e)
		if slices.Contains(pooled, id) {
			t.Fatalf("a create with custom memory was served from the pool: %s", id)
		}
		sb, _ := env.Client.Sandbox(ctx, id)
		if res := sh(t, sb, "", "echo $POOL_VAR"); res.Stdout != "cold\n" {
			t.Fatalf("cold create env: %+v", res)
		}
		after := a.pools(t)["base"]
		if after.Misses != before.Misses+1 || after.HandedOut != before.HandedOut || after.Ready != 2 {
			t.Fatalf("pool after a create it cannot serve: before %+v after %+v", before, after)
		}
		// The same state in Prometheus' format.
		st, _, body := a.do(t, "GET", "/metrics", env.APIKey, nil, nil)
		for _, want := range []string{
			`cella_pool_ready{template="base"} 2`, `cella_pool_size{template="base"} 2`,
			fmt.Sprintf(`cella_pool_misses_total{template="base"} %d`, after.Misses),
			fmt.Sprintf(`cella_pool_handed_out_total{template="base"} %d`, after.HandedOut),
			`cella_sandboxes{state="running"}`, `cella_egress_decisions_total{decision="allowed"}`,
		} {
			if st != 200 || !strings.Contains(string(body), want) {
				t.Fatalf("/metrics lacks %q (status %d):\n%s", want, st, body)
			}
		}
		if st, _, _ := a.do(t, "GET", "/metrics", "", nil, nil); st != 401 {
			t.Fatalf("/metrics without a key: %d", st)
		}
	})

	t.Run("Latency", func(t *testing.T) {
		// Alternate warm and cold creates, each on a full, idle pool.
		for i := 0; i < 3; i++ {
			a.waitPool(t, "base", 2)
			_, c, e := poolCreate(t, a, key, map[string]any{"templateID": "base", "envVars": map[string]string{"I": fmt.Sprint(i)}})
			warmCreate, warmExec = append(warmCreate, c), append(warmExec, e)
			a.waitPool(t, "base", 2)
			_, c, e = poolCreate(t, a, key, map[string]any{"templateID": "base", "pidsLimit": 300})
			coldCreate, coldExec = append(coldCreate, c), append(coldExec, e)
		}
		t.Logf("create latency, median of %d: warm pool %v (create→first exec %v); cold %v (create→first exec %v)",
			len(warmCreate), median(warmCreate).Round(time.Microsecond), median(warmExec).Round(time.Microsecond),
			median(coldCreate).Round(time.Millisecond), median(coldExec).Round(time.Millisecond))
		t.Logf("warm creates %v / first exec %v; cold creates %v / first exec %v", warmCreate, warmExec, coldCreate, coldExec)
	})

	t.Run("EmptyPoolFallsBack", func(t *testing.T) {
		a.waitPool(t, "base", 2)
		before := a.pools(t)["base"]
		// Three creates back to back: the pool of 2 runs dry, and the third
		// is a cold create, not an error.
		for i := 0; i < 3; i++ {
			poolCreate(t, a, key, map[string]any{"templateID": "base"})
		}
		after := a.pools(t)["base"]
		if served := (after.HandedOut - before.HandedOut) + (after.Misses - before.Misses); served != 3 {
			t.Fatalf("three creates: handedOut+misses grew by %d; before %+v after %+v", served, before, after)
		}
		if after.Misses == before.Misses {
			t.Logf("the pool refilled fast enough to serve all three: %+v", after)
		}
	})

	t.Run("CrashLeavesNothing", func(t *testing.T) {
		// Kill every handed-out sandbox: what is left are the pooled ones,
		// which have no record.
		list, _ := env.Client.List(ctx)
		for _, d := range list {
			env.Client.Kill(ctx, d.SandboxID)
		}
		held := a.waitPool(t, "base", 2).Ready
		pooledNow := poolDirs(t, env)
		if len(pooledNow) != held {
			t.Fatalf("sandbox dirs: %v, pool %d", pooledNow, held)
		}
		// A daemon that starts after a crash reconciles the data dir: a
		// second manager over the same runtime, store and directory (no
		// network) stands in for it.
		d := env.Daemon
		m2, err := sandbox.NewManager(sandbox.Config{DataDir: env.DataDir, Runtime: d.Runtime, Templates: d.Templates, Store: d.Store,
			Agents: d.Agents, Agent: d.Agent})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := m2.Reconcile(ctx)
		m2.Shutdown(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range pooledNow {
			if !slices.Contains(rep.RemovedContainers, id) || !slices.Contains(rep.RemovedDirs, filepath.Join(env.DataDir, "sandboxes", id)) {
				t.Fatalf("reconcile did not remove pooled sandbox %s: %+v", id, rep)
			}
			if len(rep.Adopted) != 0 || len(rep.MarkedDead) != 0 {
				t.Fatalf("reconcile found records of pooled sandboxes: %+v", rep)
			}
		}
		if left := containersOf(t, env, pooledNow); len(left) != 0 {
			t.Fatalf("containers left after reconcile: %v", left)
		}
		// The running daemon notices its pooled sandboxes are gone and
		// makes new ones.
		deadline := time.Now().Add(3 * time.Minute)
		for {
			now := poolDirs(t, env)
			p := a.pools(t)["base"]
			if p.Ready >= 2 && p.Filling == 0 && len(now) == p.Ready && !slices.ContainsFunc(now, func(id string) bool { return slices.Contains(pooledNow, id) }) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool did not replace its lost sandboxes: %+v dirs %v", p, now)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	t.Run("SizeZero", func(t *testing.T) {
		pooledNow := poolDirs(t, env)
		st, _, body := a.do(t, "PUT", "/pools/base", key, map[string]any{"size": 0}, nil)
		if st != 200 {
			t.Fatalf("PUT size 0: %d %s", st, body)
		}
		if ps := a.pools(t); len(ps) != 0 {
			t.Fatalf("pools after size 0: %+v", ps)
		}
		if left := poolDirs(t, env); len(left) != 0 {
			t.Fatalf("sandbox dirs after size 0: %v", left)
		}
		if left := containersOf(t, env, pooledNow); len(left) != 0 {
			t.Fatalf("containers after size 0: %v", left)
		}
		// No pool: creates are cold and counted nowhere.
		poolCreate(t, a, key, map[string]any{"templateID": "base"})
		if ps := a.pools(t); len(ps) != 0 {
			t.Fatalf("pools: %+v", ps)
		}
	})

	t.Run("ShutdownAndRestore", func(t *testing.T) {
		if st, _, body := a.do(t, "PUT", "/pools/base", key, map[string]any{"size": 1}, nil); st != 200 {
			t.Fatalf("PUT size 1: %d %s", st, body)
		}
		a.waitPool(t, "base", 1)
		all := sandboxDirs(t, env)
		env.Close()
		if left := sandboxDirs(t, env); len(left) != 0 {
			t.Fatalf("sandbox dirs after shutdown: %v", left)
		}
		if left, err := env.Daemon.Runtime.List(ctx); err != nil || len(left) != 0 {
			t.Fatalf("containers after shutdown: %v %v (had %v)", err, left, all)
		}
		// The next daemon on this data dir brings the pool back.
		env2 := daemontest.Start(t, runtime.GVisor, daemontest.Options{DataDir: env.DataDir})
		a2 := apiT{env: env2}
		p := a2.waitPool(t, "base", 1)
		if p.Size != 1 || p.HandedOut != 0 {
			t.Fatalf("restored pool: %+v", p)
		}
		id, c, e := poolCreate(t, a2, env2.APIKey, map[string]any{"templateID": "base", "envVars": map[string]string{"X": "after-restart"}})
		sb, _ := env2.Client.Sandbox(ctx, id)
		if res := sh(t, sb, "", "echo $X"); res.Stdout != "after-restart\n" {
			t.Fatalf("env in a pooled sandbox after restart: %+v", res)
		}
		if p := a2.pools(t)["base"]; p.HandedOut != 1 {
			t.Fatalf("pool after restart and a create: %+v", p)
		}
		t.Logf("after restart: warm create %v, first exec %v", c.Round(time.Microsecond), e.Round(time.Microsecond))
		env2.Close()
		if left := sandboxDirs(t, env2); len(left) != 0 {
			t.Fatalf("sandbox dirs after the second shutdown: %v", left)
		}
	})
}
