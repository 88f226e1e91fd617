package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// TestTenancy attacks one team's resources with another team's key over
// every route that names a sandbox, snapshot or volume, the sandbox proxy
// and the PTY: each answer is the one an unknown ID gets (same status, same
// words), nothing of the victim's shows in a list, and the victim's sandbox
// is unharmed. A second key of the victim's team sees and acts on the
// team's sandbox; the admin sees everything.
func TestTenancy(t *testing.T) {
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{Network: daemon.NetworkConfig{Allow: []string{"a.test", "b.test"}}})
	a := apiT{env: env}
	ctx := context.Background()
	newKey := func(nk client.NewKey) client.Key {
		k, err := env.Client.CreateKey(ctx, nk)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	alice := newKey(client.NewKey{Name: "alice", Team: "red"})
	alice2 := newKey(client.NewKey{Name: "alice2", Team: "red"})
	bob := newKey(client.NewKey{Name: "bob", Team: "blue"})
	if alice.TeamID == bob.TeamID || alice.TeamID != alice2.TeamID {
		t.Fatalf("teams: %+v %+v %+v", alice, alice2, bob)
	}

	// Alice's resources: a sandbox with a private port, a named snapshot,
	// a volume.
	st, _, body := a.do(t, "POST", "/v2/sandboxes", alice.Key, map[string]any{"templateID": "base", "network": map[string]any{"allowPublicTraffic": false}}, nil)
	if st != 201 {
		t.Fatalf("alice's create: %d %s", st, body)
	}
	var victim struct {
		SandboxID, EnvdAccessToken string
		TrafficAccessToken         *string
	}
	json.Unmarshal(body, &victim)
	id := victim.SandboxID
	defer env.Client.Kill(ctx, id)
	aliceClient, err := client.New(client.Config{URL: env.URL, APIKey: alice.Key})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := aliceClient.Sandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := aliceClient.Snapshot(ctx, id, "red-snap"); err != nil {
		t.Fatal(err)
	}
	if _, err := aliceClient.CreateVolume(ctx, "red-vol", 32); err != nil {
		t.Fatal(err)
	}

	const unknown = "nosuchsandboxnosuch0"
	sameAsUnknown := func(t *testing.T, method, path string, body any) {
		t.Helper()
		gotSt, _, got := a.do(t, method, strings.ReplaceAll(path, "ID", id), bob.Key, body, nil)
		wantSt, _, want := a.do(t, method, strings.ReplaceAll(path, "ID", unknown), bob.Key, body, nil)
		if gotSt != wantSt || strings.ReplaceAll(string(got), id, unknown) != string(want) {
			t.Fatalf("%s %s as another team: %d %s; an unknown ID: %d %s", method, path, gotSt, got, wantSt, want)
		}
		if gotSt < 400 {
			t.Fatalf("%s %s as another team succeeded: %d %s", method, path, gotSt, got)
		}
		if strings.Contains(string(got), victim.EnvdAccessToken) {
			t.Fatalf("%s %s leaks the access token: %s", method, path, got)
		}
	}

	t.Run("SandboxRoutes", func(t *testing.T) {
		for _, r := range []struct {
			method, path string
			body         any
		}{
			{"GET", "/sandboxes/ID", nil},
			{"POST", "/sandboxes/ID/timeout", map[string]any{"timeout": 1}},
			{"POST", "/sandboxes/ID/refreshes", map[string]any{"duration": 1}},
			{"POST", "/sandboxes/ID/connect", map[string]any{"timeout": 1}},
			{"POST", "/v2/sandboxes/ID/connect", map[string]any{"timeout": 1}},
			{"POST", "/sandboxes/ID/pause", nil},
			{"POST", "/sandboxes/ID/resume", nil},
			{"PUT", "/sandboxes/ID/network", map[string]any{"allowOut": []string{"b.test"}}},
			{"GET", "/sandboxes/ID/metrics", nil},
			{"GET", "/sandboxes/ID/logs", nil},
			{"GET", "/v2/sandboxes/ID/logs", nil},
			{"POST", "/sandboxes/ID/snapshots", map[string]any{"name": "stolen"}},
			{"POST", "/sandboxes/ID/fork", map[string]any{"count": 1}},
			{"POST", "/sandboxes/ID/wait", map[string]any{"port": 1, "timeout": 1}},
			{"GET", "/sandboxes/ID/processes/1/logs", nil},
			{"GET", "/sandboxes/ID/pty", nil},
			{"DELETE", "/sandboxes/ID", nil},
		} {
			sameAsUnknown(t, r.method, r.path, r.body)
		}
	})

	t.Run("Lists", func(t *testing.T) {
		// Alice sees her sandbox's lifecycle events (stored asynchronously).
		deadline := time.Now().Add(30 * time.Second)
		for {
			st, _, body := a.do(t, "GET", "/events/sandboxes/"+id, alice.Key, nil, nil)
			if st == 200 && strings.Contains(string(body), `"sandbox.lifecycle.created"`) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("alice's events: %d %s", st, body)
			}
			time.Sleep(50 * time.Millisecond)
		}
		for _, path := range []string{"/sandboxes", "/v2/sandboxes", "/v2/sandboxes?state=running,paused,dead", "/snapshots", "/volumes", "/sandboxes/metrics?sandbox_ids=" + id,
			"/events/sandboxes/" + id, "/events/webhooks"} {
			st, _, body := a.do(t, "GET", path, bob.Key, nil, nil)
			if st != 200 || strings.Contains(string(body), id) || strings.Contains(string(body), "red-") {
				t.Fatalf("GET %s as another team: %d %s", path, st, body)
			}
		}
		for _, path := range []string{"/sandboxes", "/snapshots", "/volumes"} {
			for _, k := range []string{alice2.Key, env.APIKey} {
				if st, _, body := a.do(t, "GET", path, k, nil, nil); st != 200 || !strings.Contains(string(body), "red-") && !strings.Contains(string(body), id) {
					t.Fatalf("GET %s by the team / the admin: %d %s", path, st, body)
				}
			}
		}
		st, _, body := a.do(t, "GET", "/metrics", bob.Key, nil, nil)
		a.wantError(t, 403, st, body, "admin key")
	})

	t.Run("SnapshotsAndVolumes", func(t *testing.T) {
		// By name and by ID: the snapshot is the team's.
		snaps, err := aliceClient.ListSnapshots(ctx, id)
		if err != nil || len(snaps) != 1 {
			t.Fatalf("alice's snapshots: %+v %v", snaps, err)
		}
		for _, ref := range []string{"red-snap", snaps[0].SnapshotID} {
			st, _, body := a.do(t, "POST", "/v2/sandboxes", bob.Key, map[string]any{"templateID": ref}, nil)
			a.wantError(t, 404, st, body, "not found")
			st, _, body = a.do(t, "DELETE", "/templates/"+ref, bob.Key, nil, nil)
			a.wantError(t, 404, st, body, "not found")
		}
		for _, r := range [][2]string{{"GET", "/volumes/red-vol"}, {"DELETE", "/volumes/red-vol"}} {
			st, _, body := a.do(t, r[0], r[1], bob.Key, nil, nil)
			a.wantError(t, 404, st, body, `volume "red-vol" not found`)
		}
		vols, err := aliceClient.ListVolumes(ctx)
		if err != nil || len(vols) != 1 {
			t.Fatalf("alice's volumes: %+v %v", vols, err)
		}
		for _, ref := range []string{"red-vol", vols[0].VolumeID} {
			st, _, body := a.do(t, "POST", "/v2/sandboxes", bob.Key, map[string]any{"templateID": "base",
				"volumeMounts": []map[string]any{{"name": ref, "path": "/mnt/v"}}}, nil)
			a.wantError(t, 400, st, body, "does not exist")
		}
		// Bob may have a red-vol of his own: names are per team.
		bobClient, _ := client.New(client.Config{URL: env.URL, APIKey: bob.Key})
		mine, err := bobClient.CreateVolume(ctx, "red-vol", 32)
		if err != nil || mine.VolumeID == vols[0].VolumeID {
			t.Fatalf("bob's own red-vol: %+v %v", mine, err)
		}
		if err := bobClient.DeleteVolume(ctx, "red-vol"); err != nil {
			t.Fatal(err)
		}
		if _, err := aliceClient.GetVolume(ctx, "red-vol"); err != nil {
			t.Fatalf("bob's delete took alice's volume: %v", err)
		}
	})

	t.Run("VolumeContent", func(t *testing.T) {
		// The standalone file API (/volumecontent) opens a volume for its
		// token or a key of its team only: bob's key, bob's token and
		// alice's token on bob's volume all answer what an unknown volume
		// ID answers, on every route, and change nothing.
		volToken := func(key, ref string) (id, token string) {
			st, _, body := a.do(t, "GET", "/volumes/"+ref, key, nil, nil)
			var v struct{ VolumeID, Token string }
			json.Unmarshal(body, &v)
			if st != 200 || !strings.HasPrefix(v.Token, "vtok_") {
				t.Fatalf("GET /volumes/%s: %d %s", ref, st, body)
			}
			return v.VolumeID, v.Token
		}
		aliceVol, aliceTok := volToken(alice.Key, "red-vol")
		bobClient, _ := client.New(client.Config{URL: env.URL, APIKey: bob.Key})
		if _, err := bobClient.CreateVolume(ctx, "blue-vol", 32); err != nil {
			t.Fatal(err)
		}
		defer bobClient.DeleteVolume(ctx, "blue-vol")
		bobVol, bobTok := volToken(bob.Key, "blue-vol")
		bearer := func(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }
		st, _, body := a.do(t, "PUT", "/volumecontent/"+aliceVol+"/file?path=/f.txt", "", "alice's", bearer(aliceTok))
		if st != 201 {
			t.Fatalf("alice's write with her token: %d %s", st, body)
		}
		routes := [][2]string{{"GET", "/dir?path=/"}, {"POST", "/dir?path=/d&force=true"}, {"GET", "/path?path=/f.txt"},
			{"PATCH", "/path?path=/f.txt"}, {"DELETE", "/path?path=/f.txt"}, {"GET", "/file?path=/f.txt"}, {"PUT", "/file?path=/f.txt&force=true"}}
		const unknownVol = "vol_0000000000000000"
		for _, cred := range []struct {
			who, key string
			hdr      map[string]string
			vol      string
		}{
			{"bob's key", bob.Key, nil, aliceVol},
			{"bob's token", "", bearer(bobTok), aliceVol},
			{"bob's key as a bearer", "", bearer(bob.Key), aliceVol},
			{"alice's token on bob's volume", "", bearer(aliceTok), bobVol},
		} {
			for _, r := range routes {
				var b any
				if r[0] == "PUT" || r[0] == "PATCH" {
					b = `{"mode":511}`
				}
				gotSt, _, got := a.do(t, r[0], "/volumecontent/"+cred.vol+r[1], cred.key, b, cred.hdr)
				wantSt, _, want := a.do(t, r[0], "/volumecontent/"+unknownVol+r[1], cred.key, b, cred.hdr)
				if gotSt != 404 || gotSt != wantSt || strings.ReplaceAll(string(got), cred.vol, unknownVol) != string(want) {
					t.Fatalf("%s %s with %s: %d %s; an unknown volume: %d %s", r[0], r[1], cred.who, gotSt, got, wantSt, want)
				}
			}
		}
		st, _, body = a.do(t, "GET", "/volumecontent/"+aliceVol+"/file?path=/f.txt", alice2.Key, nil, nil)
		if st != 200 || string(body) != "alice's" {
			t.Fatalf("alice's file after the attempts, read with a key of her team: %d %s", st, body)
		}
		st, _, body = a.do(t, "GET", "/volumecontent/"+aliceVol+"/file?path=/f.txt", "", nil, nil)
		a.wantError(t, 401, st, body, "token")
		for _, key := range []string{alice.Key, bob.Key} {
			st, _, body := a.do(t, "GET", "/volumes", key, nil, nil)
			if st != 200 || strings.Contains(string(body), "vtok_") {
				t.Fatalf("GET /volumes carries a token: %d %s", st, body)
			}
		}
		// The tokens are sealed in the database, not kept in the clear.
		for _, f := range []string{"cella.db", "cella.db-wal"} {
			b, _ := os.ReadFile(filepath.Join(env.DataDir, f))
			if strings.Contains(string(b), aliceTok) || strings.Contains(string(b), bobTok) {
				t.Fatalf("%s holds a volume token in the clear", f)
			}
		}
	})

	t.Run("Proxy", func(t *testing.T) {
		// Without the token nothing reaches the agent, and no answer of
		// the API gave bob the token.
		for _, path := range []string{"/envs", "/process.Process/List"} {
			st, _, body := a.do(t, "POST", path, "", "{}", map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "Content-Type": "application/json"})
			if st != 401 || !strings.Contains(string(body), "access token") {
				t.Fatalf("%s without the token: %d %s", path, st, body)
			}
			st, _, body = a.do(t, "POST", path, "", "{}", map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "Content-Type": "application/json", "X-Access-Token": "guess"})
			if st != 401 {
				t.Fatalf("%s with a wrong token: %d %s", path, st, body)
			}
		}
		// A private port needs the traffic token.
		st, _, body := a.do(t, "GET", "/", "", nil, map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "8000"})
		if st != 403 {
			t.Fatalf("private port without the traffic token: %d %s", st, body)
		}
	})

	t.Run("PTY", func(t *testing.T) {
		for _, k := range []string{bob.Key} {
			wsURL := "ws" + strings.TrimPrefix(env.URL, "http") + "/sandboxes/" + id + "/pty?key=" + k
			c, resp, err := websocket.Dial(ctx, wsURL, nil)
			if err == nil {
				c.CloseNow()
				t.Fatal("another team's key opened a shell in the sandbox")
			}
			if resp == nil || resp.StatusCode != http.StatusNotFound {
				t.Fatalf("PTY as another team: %v %v", resp, err)
			}
		}
	})

	t.Run("Unharmed", func(t *testing.T) {
		d, err := aliceClient.Get(ctx, id)
		if err != nil || d.State != "running" || time.Until(d.EndAt) < time.Minute {
			t.Fatalf("alice's sandbox after the attacks: %+v %v", d, err)
		}
		res, err := sb.Exec(ctx, "echo still-mine", client.ExecOptions{})
		if err != nil || res.Stdout != "still-mine\n" {
			t.Fatalf("exec after the attacks: %+v %v", res, err)
		}
		if snaps, _ := aliceClient.ListSnapshots(ctx, id); len(snaps) != 1 {
			t.Fatalf("snapshots after the attacks: %+v", snaps)
		}
	})

	t.Run("TeamShares", func(t *testing.T) {
		c2, _ := client.New(client.Config{URL: env.URL, APIKey: alice2.Key})
		sb2, err := c2.Sandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if res, err := sb2.Exec(ctx, "echo team", client.ExecOptions{}); err != nil || res.Stdout != "team\n" {
			t.Fatalf("a teammate's exec: %+v %v", res, err)
		}
	})
}
