package gateway_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"context"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/clustertest"
)

type listItem struct {
	SandboxID  string            `json:"sandboxID"`
	StartedAt  time.Time         `json:"startedAt"`
	State      string            `json:"state"`
	Metadata   map[string]string `json:"metadata"`
	LostReason string            `json:"lostReason"`
}

// TestGatewayList: GET /sandboxes and /v2/sandboxes through the gateway
// list the caller's sandboxes of every node (made on either node, or
// through the gateway), never another team's; E2B's metadata and state
// filters hold; v2's pages (limit, X-Next-Token) walk the merged list in
// startedAt order with nothing twice and nothing left out; and once a node
// is killed its sandboxes are still listed, as "lost" with the reason,
// to their owners only.
func TestGatewayList(t *testing.T) {
	const ns = "cella-gwlist"
	cp, cl := clustertest.StartIn(t, ns)
	nodeA := cp.StartNode(t, clustertest.NodeOptions{Name: "node-a", Namespace: ns})
	nodeB := cp.StartNode(t, clustertest.NodeOptions{Name: "node-b", Namespace: ns})
	gw := cp.StartGateway(t, "gw-1", ns)
	admin := nodeA.AdminKey(t)
	clustertest.WaitLive(t, cl, ns, 2)
	alice := newKey(t, gw.URL, admin, "alice", "alpha")
	bob := newKey(t, gw.URL, admin, "bob", "beta")

	create := func(base, key, grp string) string {
		t.Helper()
		code, body := call(t, "POST", base+"/sandboxes", key, fmt.Sprintf(`{"templateID":"base","timeout":600,"metadata":{"grp":%q}}`, grp))
		if code != http.StatusCreated {
			t.Fatalf("create at %s: %d %s", base, code, body)
		}
		var sb struct {
			SandboxID string `json:"sandboxID"`
		}
		_ = json.Unmarshal([]byte(body), &sb)
		return sb.SandboxID
	}
	onA := []string{create(nodeA.URL, alice, "x"), create(nodeA.URL, alice, "y")}
	onB := []string{create(nodeB.URL, alice, "x"), create(nodeB.URL, alice, "y")}
	viaGW := create(gw.URL, alice, "x")
	bobs := create(nodeB.URL, bob, "x")
	aliceAll := append(append(slices.Clone(onA), onB...), viaGW)

	list := func(key, query string) ([]listItem, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", gw.URL+query, nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var items []listItem
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&items) != nil {
			t.Fatalf("GET %s: %s", query, resp.Status)
		}
		return items, resp.Header.Get("X-Next-Token")
	}
	ids := func(items []listItem) []string {
		var out []string
		for _, it := range items {
			out = append(out, it.SandboxID)
		}
		sort.Strings(out)
		return out
	}
	sorted := func(s []string) []string { s = slices.Clone(s); sort.Strings(s); return s }

	for _, q := range []string{"/sandboxes", "/v2/sandboxes"} {
		if got, _ := list(alice, q); !slices.Equal(ids(got), sorted(aliceAll)) {
			t.Errorf("alice's GET %s: %v, want %v", q, ids(got), sorted(aliceAll))
		}
		if got, _ := list(bob, q); !slices.Equal(ids(got), []string{bobs}) {
			t.Errorf("bob's GET %s: %v, want only his %s", q, ids(got), bobs)
		}
		if got, _ := list(admin, q); len(got) != 6 {
			t.Errorf("the admin's GET %s: %d sandboxes, want 6", q, len(got))
		}
	}
	wantY := sorted([]string{onA[1], onB[1]})
	for _, q := range []string{"/sandboxes?metadata=grp%3Dy", "/v2/sandboxes?metadata=grp%3Dy"} {
		if got, _ := list(alice, q); !slices.Equal(ids(got), wantY) {
			t.Errorf("alice's GET %s: %v, want %v", q, ids(got), wantY)
		}
	}

	// Pages of 2 over five sandboxes on two nodes, newest first.
	var walked []listItem
	token, pages := "", 0
	for {
		q := "/v2/sandboxes?limit=2"
		if token != "" {
			q += "&nextToken=" + token
		}
		page, next := list(alice, q)
		pages++
		if len(page) > 2 {
			t.Fatalf("page %d has %d items, limit 2", pages, len(page))
		}
		walked = append(walked, page...)
		if next == "" {
			break
		}
		if pages > 5 {
			t.Fatalf("more than 5 pages: %v", walked)
		}
		token = next
	}
	if pages != 3 || !slices.Equal(ids(walked), sorted(aliceAll)) {
		t.Errorf("paging walked %d pages, %v; want 3 pages of all of %v", pages, ids(walked), sorted(aliceAll))
	}
	for i := 1; i < len(walked); i++ {
		if walked[i].StartedAt.After(walked[i-1].StartedAt) {
			t.Errorf("pages out of order (newest first): %v then %v", walked[i-1], walked[i])
		}
	}

	// The state filter: one of alice's paused.
	// A paused sandbox outlives its daemon's stop: killed before the node
	// stops, so the test leaves nothing.
	t.Cleanup(func() { call(t, "DELETE", nodeA.URL+"/sandboxes/"+onA[0], admin, "") })
	if code, body := call(t, "POST", gw.URL+"/sandboxes/"+onA[0]+"/pause", alice, ""); code != http.StatusNoContent {
		t.Fatalf("pause through the gateway: %d %s", code, body)
	}
	if got, _ := list(alice, "/v2/sandboxes?state=paused"); !slices.Equal(ids(got), []string{onA[0]}) || got[0].State != "paused" {
		t.Errorf("state=paused: %+v, want only %s", got, onA[0])
	}
	if got, _ := list(alice, "/v2/sandboxes?state=running"); len(got) != 4 || slices.Contains(ids(got), onA[0]) {
		t.Errorf("state=running: %v, want the 4 running", ids(got))
	}

	// A node records its sandboxes once a second (daemon.recordInterval):
	// one killed before its next pass takes an unrecorded sandbox with it,
	// which no list can show. So node B dies only once every sandbox has
	// its record; where the gateway put its create decides what B's death
	// takes.
	var lostOnB []string
	clustertest.Poll(t, time.Minute, "every sandbox recorded", func(ctx context.Context) (bool, string) {
		lostOnB = nil
		for _, id := range append(slices.Clone(aliceAll), bobs) {
			rec, err := cluster.NewRecords(cl, ns).Sandbox(ctx, id)
			if err != nil {
				return false, fmt.Sprintf("%s: %v", id, err)
			}
			if rec.Spec.Node == nodeB.Name && id != bobs {
				lostOnB = append(lostOnB, id)
			}
		}
		return true, ""
	})

	// Node B dies: its sandboxes are listed lost, with the reason (first
	// that it does not answer, then, once its Lease lapsed, that).
	nodeB.Kill()
	clustertest.Poll(t, 2*time.Minute, "node b's sandboxes listed lost", func(ctx context.Context) (bool, string) {
		got, _ := list(alice, "/v2/sandboxes?state=running,paused,lost")
		lost := 0
		for _, it := range got {
			if slices.Contains(onB, it.SandboxID) && it.State == "lost" && strings.Contains(it.LostReason, "node node-b stopped renewing its lease") {
				lost++
			}
		}
		return len(got) == 5 && lost == 2, fmt.Sprintf("%+v", got)
	})
	if got, _ := list(bob, "/v2/sandboxes?state=lost,running"); len(got) != 1 || got[0].SandboxID != bobs || got[0].State != "lost" {
		t.Errorf("bob's list with node b dead: %+v, want his one, lost", got)
	}
	// Unasked, the list holds E2B's states only (its clients parse any
	// other as an error), as a node's holds no dead sandbox unasked; a lost
	// entry has every field of E2B's list item.
	var onLive []string
	for _, id := range aliceAll {
		if !slices.Contains(lostOnB, id) {
			onLive = append(onLive, id)
		}
	}
	if got, _ := list(alice, "/v2/sandboxes"); !slices.Equal(ids(got), sorted(onLive)) {
		t.Errorf("the default list with node b dead: %v, want those on node a, %v", ids(got), sorted(onLive))
	}
	if got, _ := list(bob, "/sandboxes"); len(got) != 0 {
		t.Errorf("bob's v1 list with node b dead: %+v, want none", got)
	}
	_, raw := call(t, "GET", gw.URL+"/v2/sandboxes?state=lost", bob, "")
	var items []map[string]any
	if err := json.Unmarshal([]byte(raw), &items); err != nil || len(items) != 1 {
		t.Fatalf("bob's state=lost: %v %s", err, raw)
	}
	for _, f := range []string{"sandboxID", "templateID", "clientID", "cpuCount", "memoryMB", "diskSizeMB", "startedAt", "endAt",
		"envdVersion", "metadata", "state", "volumeMounts", "lostReason", "node"} {
		if _, ok := items[0][f]; !ok {
			t.Errorf("a lost entry lacks E2B's %q: %s", f, raw)
		}
	}
	if got, _ := list(alice, "/v2/sandboxes?state=lost"); !slices.Equal(ids(got), sorted(lostOnB)) {
		t.Errorf("state=lost: %v, want %v", ids(got), sorted(lostOnB))
	}
	if got, _ := list(alice, "/v2/sandboxes?state=running"); slices.Contains(ids(got), onB[0]) {
		t.Errorf("state=running lists a lost sandbox: %v", ids(got))
	}
	// The dead node's sandboxes are reaped by a daemon on its data dir.
	cp.StartNode(t, clustertest.NodeOptions{Name: nodeB.Name, Namespace: ns, DataDir: nodeB.DataDir})
}
