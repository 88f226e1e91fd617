package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// TestForkRights: a sandbox forked, or created from a snapshot, by a key of
// the same team gets that key's rights, not the original's. A key whose
// ceiling is one host forks a sandbox allowed two: the fork reaches only
// the one (the proxy refuses the other); a key without a secret forks a
// sandbox whose header rule attaches it: the fork has no such rule; the
// memory of a sandbox with a secret in its environment cannot be restored
// by a key that may not use that secret, and can by one that may.
func TestForkRights(t *testing.T) {
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{Network: daemon.NetworkConfig{Allow: []string{"a.test", "b.test"}}})
	a := apiT{env: env}
	ctx := context.Background()
	if _, err := env.Client.CreateSecret(ctx, "TOKEN", "tok-"+strings.Repeat("x", 24), nil); err != nil {
		t.Fatal(err)
	}
	key := func(nk client.NewKey) client.Key {
		k, err := env.Client.CreateKey(ctx, nk)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	owner := key(client.NewKey{Name: "owner", Team: "red", Secrets: []string{"TOKEN"}})
	narrow := key(client.NewKey{Name: "narrow", Team: "red", EgressAllow: []string{"a.test"}})

	create := func(t *testing.T, k string, body map[string]any) string {
		t.Helper()
		st, _, b := a.do(t, "POST", "/v2/sandboxes", k, body, nil)
		if st != 201 {
			t.Fatalf("create: %d %s", st, b)
		}
		var sb struct{ SandboxID string }
		json.Unmarshal(b, &sb)
		t.Cleanup(func() { env.Client.Kill(context.Background(), sb.SandboxID) })
		return sb.SandboxID
	}
	type netInfo struct {
		Network struct {
			Effective struct {
				AllowOut []string
				Rules    map[string][]struct {
					Transform *struct{ Headers map[string]string }
				}
			}
		}
	}
	detail := func(t *testing.T, id string) netInfo {
		t.Helper()
		st, _, b := a.do(t, "GET", "/sandboxes/"+id, env.APIKey, nil, nil)
		if st != 200 {
			t.Fatalf("detail: %d %s", st, b)
		}
		var d netInfo
		json.Unmarshal(b, &d)
		return d
	}
	forkAs := func(t *testing.T, k, id string) (int, string, []byte) {
		t.Helper()
		st, _, b := a.do(t, "POST", "/sandboxes/"+id+"/fork", k, map[string]any{"count": 1}, nil)
		var res []struct {
			Sandbox *struct{ SandboxID string }
			Error   *struct{ Message string }
		}
		json.Unmarshal(b, &res)
		if st == 201 && len(res) == 1 && res[0].Sandbox != nil {
			t.Cleanup(func() { env.Client.Kill(context.Background(), res[0].Sandbox.SandboxID) })
			return st, res[0].Sandbox.SandboxID, b
		}
		return st, "", b
	}
	// proxyRefuses reports whether the egress proxy refuses host for the
	// sandbox (a plain HTTP request naming it, answered by the proxy).
	proxyRefuses := func(t *testing.T, id, host string) bool {
		t.Helper()
		sb, err := env.Client.Sandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		res, err := sb.Exec(ctx, "curl -sS -m 10 -H 'Host: "+host+"' http://10.1.2.3/", client.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return strings.HasPrefix(res.Stdout, "blocked by cella sandbox policy: "+host+" is not allowed")
	}

	rules := map[string]any{"a.test": []map[string]any{{"transform": map[string]any{"headers": map[string]string{
		"X-Token": "${e2b.secrets.TOKEN}", "X-Plain": "literal"}}}}}
	orig := create(t, owner.Key, map[string]any{"templateID": "base", "network": map[string]any{"rules": rules}})
	if d := detail(t, orig); len(d.Network.Effective.AllowOut) != 2 || len(d.Network.Effective.Rules["a.test"]) != 1 {
		t.Fatalf("the original's policy: %+v", d)
	}
	if proxyRefuses(t, orig, "b.test") {
		t.Fatal("the original may not reach b.test")
	}

	t.Run("Fork", func(t *testing.T) {
		st, fork, b := forkAs(t, narrow.Key, orig)
		if st != 201 || fork == "" {
			t.Fatalf("fork by the narrow key: %d %s", st, b)
		}
		d := detail(t, fork)
		if got := d.Network.Effective.AllowOut; len(got) != 1 || got[0] != "a.test" {
			t.Fatalf("the fork's egress: %v, want only a.test", got)
		}
		if rs := d.Network.Effective.Rules["a.test"]; len(rs) != 1 || rs[0].Transform == nil || rs[0].Transform.Headers["X-Token"] != "" || rs[0].Transform.Headers["X-Plain"] == "" {
			t.Fatalf("the fork's header rules: %+v (want X-Plain only)", rs)
		}
		if !proxyRefuses(t, fork, "b.test") {
			t.Fatal("the fork reaches b.test, outside its key's ceiling")
		}
		if proxyRefuses(t, fork, "a.test") {
			t.Fatal("the fork lost a.test, inside its key's ceiling")
		}
	})

	t.Run("FromSnapshot", func(t *testing.T) {
		st, _, b := a.do(t, "POST", "/sandboxes/"+orig+"/snapshots", owner.Key, map[string]any{"name": "wide"}, nil)
		if st != 201 {
			t.Fatalf("snapshot: %d %s", st, b)
		}
		id := create(t, narrow.Key, map[string]any{"templateID": "wide"})
		d := detail(t, id)
		if got := d.Network.Effective.AllowOut; len(got) != 1 || got[0] != "a.test" {
			t.Fatalf("from the snapshot: egress %v, want only a.test", got)
		}
		if rs := d.Network.Effective.Rules["a.test"]; len(rs) != 1 || rs[0].Transform.Headers["X-Token"] != "" {
			t.Fatalf("from the snapshot: header rules %+v", rs)
		}
		if !proxyRefuses(t, id, "b.test") {
			t.Fatal("a sandbox from the snapshot reaches b.test, outside its key's ceiling")
		}
	})

	t.Run("SecretInMemory", func(t *testing.T) {
		withEnv := create(t, owner.Key, map[string]any{"templateID": "base", "secretEnvVars": map[string]string{"TOKEN": "TOKEN"}})
		st, _, b := forkAs(t, narrow.Key, withEnv)
		a.wantError(t, 403, st, b, "TOKEN")
		st, _, b = a.do(t, "POST", "/sandboxes/"+withEnv+"/snapshots", owner.Key, map[string]any{"name": "with-secret"}, nil)
		if st != 201 {
			t.Fatalf("snapshot: %d %s", st, b)
		}
		st, _, b = a.do(t, "POST", "/v2/sandboxes", narrow.Key, map[string]any{"templateID": "with-secret"}, nil)
		a.wantError(t, 403, st, b, "TOKEN")
		if st, fork, b := forkAs(t, owner.Key, withEnv); st != 201 || fork == "" {
			t.Fatalf("fork by a key that may use the secret: %d %s", st, b)
		}
	})
}
