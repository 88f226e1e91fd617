package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/apiwire"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/clustertest"
)

// TestClusterRoutes: the E2B calls that name no one sandbox, through
// either of two gateways in front of two real nodes, as a team's key.
//   - Volumes: a volume made through gw-1 is recorded on its node (a second
//     create of its name through gw-2 is 409); a file written through gw-1's
//     volumecontent with the volume's token is read through gw-2 with the
//     team's key; a sandbox created through gw-2 that mounts it lands on the
//     volume's node although placement alone would pick the other (the
//     volume's node holds more sandboxes) and sees the file.
//   - Snapshots: a snapshot taken through gw-1 is listed through gw-2; a
//     create from it through gw-2 lands on its node (again the busier one);
//     deleted through gw-1, it is gone from gw-2's list.
//   - Batch metrics and events for sandboxes on both nodes merge.
//   - A webhook registered through gw-1 receives the events of sandboxes on
//     both nodes (so on one that did not answer the registration).
//   - Pools: PUT through a gateway sets every node's pool, GET sums them.
//   - A fork through gw-2 is usable through gw-2 at once.
//   - Another team's key sees none of it: the same 404 as an unknown ID,
//     empty lists; its own volume of the same name is another volume, and
//     deleting it frees its record and name only.
//   - The volume's node drained: a create mounting it is refused naming the
//     volume and the node; mounting volumes of two nodes is a 409 naming
//     both.
//   - The volume's node killed: a create mounting it is refused naming the
//     volume and the node, and the volume is listed unavailable.
func TestClusterRoutes(t *testing.T) {
	const ns = "cella-routes"
	cp, cl := clustertest.StartIn(t, ns)
	byName := map[string]*clustertest.Proc{}
	for _, name := range []string{"node-a", "node-b"} {
		byName[name] = cp.StartNode(t, clustertest.NodeOptions{Name: name, Namespace: ns, Args: []string{"--webhook-allow=127.0.0.1"}})
	}
	gw1 := cp.StartGateway(t, "gw-1", ns)
	gw2 := cp.StartGateway(t, "gw-2", ns)
	clustertest.WaitLive(t, cl, ns, 2)
	admin := byName["node-a"].AdminKey(t)
	alpha := newKey(t, gw1.URL, admin, "alpha", "alpha")
	beta := newKey(t, gw1.URL, admin, "beta", "beta")
	records := cluster.NewRecords(cl, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c1, err := client.New(client.Config{URL: gw1.URL, APIKey: alpha})
	if err != nil {
		t.Fatal(err)
	}
	c2, err := client.New(client.Config{URL: gw2.URL, APIKey: alpha})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var ids []string
	t.Cleanup(func() {
		for _, id := range ids {
			_ = c2.Kill(context.Background(), id)
		}
	})
	nodeOf := func(id string) string {
		t.Helper()
		var node string
		clustertest.Poll(t, 2*time.Minute, id+" recorded", func(ctx context.Context) (bool, string) {
			rec, err := records.Sandbox(ctx, id)
			if err != nil {
				return false, err.Error()
			}
			node = rec.Spec.Node
			return true, ""
		})
		return node
	}
	create := func(gw *clustertest.Proc, body string) string {
		t.Helper()
		code, out := call(t, "POST", gw.URL+"/sandboxes", alpha, body)
		var sb struct {
			SandboxID string `json:"sandboxID"`
		}
		if code != http.StatusCreated || json.Unmarshal([]byte(out), &sb) != nil || sb.SandboxID == "" {
			t.Fatalf("create %s through %s: %d %s", body, gw.Name, code, out)
		}
		mu.Lock()
		ids = append(ids, sb.SandboxID)
		mu.Unlock()
		return sb.SandboxID
	}
	const plain = `{"templateID":"base","timeout":900}`

	// A volume through gw-1.
	code, body := call(t, "POST", gw1.URL+"/volumes", alpha, `{"name":"shared"}`)
	if code != http.StatusCreated {
		t.Fatalf("POST /volumes through gw-1: %d %s", code, body)
	}
	var vol apiwire.Volume
	if err := json.Unmarshal([]byte(body), &vol); err != nil || vol.VolumeID == "" || vol.Token == "" {
		t.Fatalf("volume answer %s: %v", body, err)
	}
	vrec, err := cluster.NewVolumeRecords(cl, ns).Named(ctx, "alpha", "shared")
	if err != nil || vrec.Spec.VolumeID != vol.VolumeID {
		t.Fatalf("the volume's record: %+v %v", vrec, err)
	}
	nv := vrec.Spec.Node
	no := "node-a"
	if nv == no {
		no = "node-b"
	}
	if code, body := call(t, "POST", gw2.URL+"/volumes", alpha, `{"name":"shared"}`); code != http.StatusConflict {
		t.Errorf("the volume's name again through gw-2: %d %s, want 409", code, body)
	}
	req, _ := http.NewRequest(http.MethodPut, gw1.URL+"/volumecontent/"+vol.VolumeID+"/file?path=/hello.txt", strings.NewReader("hello from the volume"))
	req.Header.Set("Authorization", "Bearer "+vol.Token)
	if code, body := do(t, req); code != http.StatusCreated {
		t.Fatalf("write a file through gw-1's volumecontent: %d %s", code, body)
	}
	if code, body := get(t, gw2.URL+"/volumecontent/"+vol.VolumeID+"/file?path=/hello.txt", alpha); code != http.StatusOK || body != "hello from the volume" {
		t.Errorf("read it through gw-2 with the team's key: %d %q", code, body)
	}
	for _, u := range []string{gw2.URL + "/volumes/shared", gw2.URL + "/volumes/" + vol.VolumeID} {
		if code, body := get(t, u, alpha); code != http.StatusOK || !strings.Contains(body, vol.VolumeID) {
			t.Errorf("GET %s: %d %s", u, code, body)
		}
	}

	// Two plain sandboxes on the volume's node (the other drained while
	// they are made): placement alone would now pick the other node.
	if err := cluster.SetDrain(ctx, cl, ns, no, true); err != nil {
		t.Fatal(err)
	}
	var onV []string
	for len(onV) < 2 {
		if len(ids) > 6 {
			t.Fatalf("creates keep landing on the drained node %s", no)
		}
		id := create(gw1, plain)
		if nodeOf(id) == nv {
			onV = append(onV, id)
			continue
		}
		// Placed before the gateway saw the drain (its view of the nodes
		// is a fraction of a second old): removed, so the counts below
		// hold.
		if err := c1.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := cluster.SetDrain(ctx, cl, ns, no, false); err != nil {
		t.Fatal(err)
	}
	clustertest.Poll(t, time.Minute, no+" undrained and counting", func(ctx context.Context) (bool, string) {
		nodes, err := cluster.Nodes(ctx, cl, ns)
		for _, n := range nodes {
			if n.Name == nv && n.Capacity.Sandboxes >= 2 {
				for _, m := range nodes {
					if m.Name == no && !m.Drained() && m.Capacity.Sandboxes == 0 {
						return true, ""
					}
				}
			}
		}
		return false, fmt.Sprint(nodes, err)
	})

	// A sandbox mounting the volume, through gw-2: on the volume's node.
	mounted := create(gw2, `{"templateID":"base","timeout":900,"volumeMounts":[{"name":"shared","path":"/mnt/shared"}]}`)
	if n := nodeOf(mounted); n != nv {
		t.Fatalf("the sandbox mounting the volume landed on %s, the volume is on %s", n, nv)
	}
	conn, err := c2.Sandbox(ctx, mounted)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := conn.Exec(ctx, "cat /mnt/shared/hello.txt", client.ExecOptions{}); err != nil || r.Stdout != "hello from the volume" {
		t.Errorf("the mounting sandbox reads the file: %+v %v", r, err)
	}
	// And one plain sandbox, which goes to the other (emptier) node.
	other := create(gw1, plain)
	if n := nodeOf(other); n != no {
		t.Fatalf("a plain create landed on %s, want the emptier %s", n, no)
	}

	// A snapshot of a sandbox on the volume's (busier) node.
	code, body = call(t, "POST", gw1.URL+"/sandboxes/"+onV[0]+"/snapshots", alpha, `{"name":"snap1"}`)
	if code != http.StatusCreated {
		t.Fatalf("snapshot through gw-1: %d %s", code, body)
	}
	var snap struct {
		SnapshotID string `json:"snapshotID"`
	}
	if err := json.Unmarshal([]byte(body), &snap); err != nil || snap.SnapshotID == "" {
		t.Fatalf("snapshot answer %s: %v", body, err)
	}
	if code, body := get(t, gw2.URL+"/snapshots", alpha); code != http.StatusOK || strings.Count(body, snap.SnapshotID) != 1 {
		t.Errorf("GET /snapshots through gw-2: %d %s, want %s once", code, body, snap.SnapshotID)
	}
	if code, body := get(t, gw2.URL+"/snapshots?name=snap1&limit=1", alpha); code != http.StatusOK || !strings.Contains(body, snap.SnapshotID) {
		t.Errorf("GET /snapshots?name=snap1 through gw-2: %d %s", code, body)
	}
	fromSnap := create(gw2, `{"templateID":"`+snap.SnapshotID+`","timeout":900}`)
	if n := nodeOf(fromSnap); n != nv {
		t.Fatalf("the create from the snapshot landed on %s, the snapshot is on %s", n, nv)
	}

	// A fork through gw-2 is used at once through gw-2 (before its node's
	// sync records it): the gateway remembers where it went.
	code, body = call(t, "POST", gw2.URL+"/sandboxes/"+fromSnap+"/fork", alpha, `{"count":1,"timeout":900}`)
	var forks []struct {
		Sandbox struct {
			SandboxID string `json:"sandboxID"`
		} `json:"sandbox"`
	}
	if code != http.StatusCreated || json.Unmarshal([]byte(body), &forks) != nil || len(forks) != 1 || forks[0].Sandbox.SandboxID == "" {
		t.Fatalf("fork through gw-2: %d %s", code, body)
	}
	fork := forks[0].Sandbox.SandboxID
	mu.Lock()
	ids = append(ids, fork)
	mu.Unlock()
	if conn, err := c2.Sandbox(ctx, fork); err != nil {
		t.Errorf("the fork through gw-2 right after it was made: %v", err)
	} else if r, err := conn.Exec(ctx, "echo forked", client.ExecOptions{}); err != nil || strings.TrimSpace(r.Stdout) != "forked" {
		t.Errorf("exec in the fork through gw-2: %+v %v", r, err)
	}

	// Batch metrics of sandboxes on both nodes.
	clustertest.Poll(t, 3*time.Minute, "batch metrics of both nodes' sandboxes", func(ctx context.Context) (bool, string) {
		code, body := get(t, gw2.URL+"/sandboxes/metrics?sandbox_ids="+onV[0]+","+other+",nosuchsandbox0000000", alpha)
		var m apiwire.SandboxesWithMetrics
		if code != http.StatusOK || json.Unmarshal([]byte(body), &m) != nil {
			return false, fmt.Sprintf("%d %s", code, body)
		}
		_, a := m.Sandboxes[onV[0]]
		_, b := m.Sandboxes[other]
		return a && b && len(m.Sandboxes) == 2, body
	})
	// Events of both nodes' sandboxes (each node stores its own as they
	// come, off the lifecycle's path), merged newest first.
	var evs []event
	clustertest.Poll(t, time.Minute, "GET /events/sandboxes through gw-1 has both nodes' sandboxes' events", func(ctx context.Context) (bool, string) {
		code, body = get(t, gw1.URL+"/events/sandboxes?limit=1000", alpha)
		evs = eventsOf(t, code, body)
		for _, id := range []string{onV[0], other} {
			if !slices.ContainsFunc(evs, func(e event) bool { return e.SandboxID == id }) {
				return false, body
			}
		}
		return true, ""
	})
	for i := 1; i < len(evs); i++ {
		if evs[i].Timestamp.After(evs[i-1].Timestamp) {
			t.Errorf("events not newest first at %d: %s", i, body)
			break
		}
	}
	code, body = get(t, gw2.URL+"/events/sandboxes/"+other+"?orderAsc=true", alpha)
	if evs := eventsOf(t, code, body); len(evs) == 0 || slices.ContainsFunc(evs, func(e event) bool { return e.SandboxID != other }) {
		t.Errorf("GET /events/sandboxes/%s through gw-2: %s", other, body)
	}

	// A webhook through gw-1 gets the events of both nodes' sandboxes.
	var hmu sync.Mutex
	var delivered []string
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		hmu.Lock()
		delivered = append(delivered, string(b))
		hmu.Unlock()
	}))
	defer recv.Close()
	code, body = call(t, "POST", gw1.URL+"/events/webhooks", alpha,
		`{"name":"all","url":"`+recv.URL+`/hook","events":["sandbox.lifecycle.killed"],"signatureSecret":"s3cret-s3cret"}`)
	if code != http.StatusCreated {
		t.Fatalf("POST /events/webhooks through gw-1: %d %s", code, body)
	}
	var hook struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(body), &hook); err != nil || hook.ID == "" {
		t.Fatalf("webhook answer %s: %v", body, err)
	}
	if code, body := get(t, gw2.URL+"/events/webhooks/"+hook.ID, alpha); code != http.StatusOK {
		t.Errorf("GET the webhook through gw-2: %d %s", code, body)
	}
	for _, id := range []string{onV[1], other} {
		if err := c1.Kill(ctx, id); err != nil {
			t.Fatalf("kill %s: %v", id, err)
		}
	}
	clustertest.Poll(t, 2*time.Minute, "the webhook receives both nodes' kills", func(ctx context.Context) (bool, string) {
		hmu.Lock()
		defer hmu.Unlock()
		all := strings.Join(delivered, "\n")
		return strings.Contains(all, onV[1]) && strings.Contains(all, other), all
	})

	// Another team sees none of it.
	unknown := "vol_00000000000000ff"
	for _, u := range []string{"/volumes/shared", "/volumes/" + vol.VolumeID, "/volumes/" + unknown, "/volumes/a%20b", "/events/webhooks/" + hook.ID} {
		if code, body := get(t, gw2.URL+u, beta); code != http.StatusNotFound {
			t.Errorf("another team: GET %s: %d %s, want 404", u, code, body)
		}
	}
	if code, body := get(t, gw2.URL+"/volumecontent/..%2F..%2Fkeys/file?path=/x", beta); code != http.StatusNotFound {
		t.Errorf("volumecontent of a crafted ID: %d %s, want 404", code, body)
	}
	_, foreign := get(t, gw2.URL+"/volumecontent/"+vol.VolumeID+"/file?path=/hello.txt", beta)
	_, unknownBody := get(t, gw2.URL+"/volumecontent/"+unknown+"/file?path=/hello.txt", beta)
	if strings.ReplaceAll(foreign, vol.VolumeID, unknown) != unknownBody || !strings.Contains(unknownBody, `"code":404`) {
		t.Errorf("another team's volumecontent %s, an unknown volume's %s: want the same 404", foreign, unknownBody)
	}
	for _, u := range []string{"/volumes", "/snapshots", "/events/sandboxes", "/events/sandboxes/" + other, "/events/webhooks"} {
		if code, body := get(t, gw1.URL+u, beta); code != http.StatusOK || strings.TrimSpace(body) != "[]" {
			t.Errorf("another team: GET %s: %d %s, want []", u, code, body)
		}
	}
	if code, body := get(t, gw1.URL+"/sandboxes/metrics?sandbox_ids="+onV[0]+","+fromSnap, beta); code != http.StatusOK || strings.Contains(body, onV[0]) {
		t.Errorf("another team's batch metrics: %d %s", code, body)
	}
	if code, body := call(t, "DELETE", gw1.URL+"/templates/"+snap.SnapshotID, beta, ""); code == http.StatusNoContent {
		t.Errorf("another team deleted the snapshot: %d %s", code, body)
	}
	if code, body := call(t, "POST", gw1.URL+"/sandboxes", beta, `{"templateID":"base","volumeMounts":[{"name":"`+vol.VolumeID+`","path":"/mnt/x"}]}`); code/100 == 2 {
		t.Errorf("another team mounted the volume: %d %s", code, body)
	}

	// The snapshot deleted through gw-1 is gone from gw-2's list.
	if code, body := call(t, "DELETE", gw1.URL+"/templates/"+snap.SnapshotID, alpha, ""); code != http.StatusNoContent {
		t.Errorf("DELETE /templates/%s through gw-1: %d %s", snap.SnapshotID, code, body)
	}
	if code, body := get(t, gw2.URL+"/snapshots", alpha); code != http.StatusOK || strings.Contains(body, snap.SnapshotID) {
		t.Errorf("GET /snapshots through gw-2 after the delete: %d %s", code, body)
	}

	// Pools: set on every node, summed.
	if code, body := call(t, "PUT", gw2.URL+"/pools/base", admin, `{"size":1}`); code != http.StatusOK || !strings.Contains(body, `"size":2`) {
		t.Errorf("PUT /pools/base through gw-2: %d %s, want the cluster's size 2", code, body)
	}
	for _, n := range byName {
		if code, body := get(t, n.URL+"/pools", admin); code != http.StatusOK || !strings.Contains(body, `"size":1`) {
			t.Errorf("%s's pools after the PUT: %d %s", n.Name, code, body)
		}
	}
	if code, body := get(t, gw1.URL+"/pools", admin); code != http.StatusOK || !strings.Contains(body, `"size":2`) {
		t.Errorf("GET /pools through gw-1: %d %s", code, body)
	}
	if code, body := call(t, "PUT", gw1.URL+"/pools/base", admin, `{"size":0}`); code != http.StatusOK {
		t.Errorf("PUT /pools/base size 0: %d %s", code, body)
	}
	if code, body := get(t, gw1.URL+"/overview", admin); code != http.StatusNotImplemented || !strings.Contains(body, "ask a node") {
		t.Errorf("GET /overview through the gateway: %d %s", code, body)
	}

	// The volume's node drained: a create mounting the volume is refused
	// naming the volume and the node, and a create mounting volumes of two
	// nodes is refused naming both.
	if err := cluster.SetDrain(ctx, cl, ns, nv, true); err != nil {
		t.Fatal(err)
	}
	mountShared := `{"templateID":"base","volumeMounts":[{"name":"shared","path":"/mnt/shared"}]}`
	clustertest.Poll(t, time.Minute, "a create mounting the volume of a drained node is refused naming both", func(ctx context.Context) (bool, string) {
		code, body := call(t, "POST", gw2.URL+"/sandboxes", alpha, mountShared)
		if code/100 == 2 {
			t.Fatalf("a create mounting the volume of a drained node: %s", body)
		}
		return code == http.StatusServiceUnavailable && strings.Contains(body, `volume \"shared\"`) && strings.Contains(body, nv) && strings.Contains(body, "drained"), fmt.Sprintf("%d %s", code, body)
	})
	code, body = call(t, "POST", gw2.URL+"/volumes", alpha, `{"name":"second"}`) // on the other node: nv is drained
	var second apiwire.Volume
	if code != http.StatusCreated || json.Unmarshal([]byte(body), &second) != nil {
		t.Fatalf("a second volume: %d %s", code, body)
	}
	if rec, err := cluster.NewVolumeRecords(cl, ns).ByID(ctx, second.VolumeID); err != nil || rec.Spec.Node != no {
		t.Fatalf("the second volume went to %+v (%v), want the undrained %s", rec, err, no)
	}
	if err := cluster.SetDrain(ctx, cl, ns, nv, false); err != nil {
		t.Fatal(err)
	}
	code, body = call(t, "POST", gw1.URL+"/sandboxes", alpha, `{"templateID":"base","volumeMounts":[{"name":"shared","path":"/mnt/a"},{"name":"second","path":"/mnt/b"}]}`)
	if code != http.StatusConflict || !strings.Contains(body, `volume \"second\"`) || !strings.Contains(body, nv) || !strings.Contains(body, no) {
		t.Errorf("a create mounting volumes of two nodes: %d %s, want 409 naming both", code, body)
	}
	if code, body := call(t, "DELETE", gw1.URL+"/volumes/second", alpha, ""); code != http.StatusNoContent {
		t.Errorf("DELETE /volumes/second: %d %s", code, body)
	}

	// A team's volume names are its own: another team's "shared" is
	// another volume, and each lists only its own.
	code, body = call(t, "POST", gw2.URL+"/volumes", beta, `{"name":"shared"}`)
	var betaVol apiwire.Volume
	if code != http.StatusCreated || json.Unmarshal([]byte(body), &betaVol) != nil || betaVol.VolumeID == vol.VolumeID {
		t.Fatalf("another team's volume of the same name: %d %s", code, body)
	}
	if code, body := get(t, gw1.URL+"/volumes", beta); code != http.StatusOK || !strings.Contains(body, betaVol.VolumeID) || strings.Contains(body, vol.VolumeID) {
		t.Errorf("another team's GET /volumes: %d %s, want its own volume only", code, body)
	}
	// Deleted through gw-1, a volume's record goes and its name is free
	// again.
	if code, body := call(t, "DELETE", gw1.URL+"/volumes/shared", beta, ""); code != http.StatusNoContent {
		t.Errorf("DELETE /volumes/shared through gw-1: %d %s", code, body)
	}
	if _, err := cluster.NewVolumeRecords(cl, ns).Named(ctx, "beta", "shared"); err == nil {
		t.Errorf("the deleted volume's record is still there")
	}
	if code, body := get(t, gw2.URL+"/volumes/"+betaVol.VolumeID, beta); code != http.StatusNotFound {
		t.Errorf("GET of the deleted volume: %d %s, want 404", code, body)
	}
	if code, body := get(t, gw2.URL+"/volumes/shared", alpha); code != http.StatusOK || !strings.Contains(body, vol.VolumeID) {
		t.Errorf("the team's own volume after another team's of its name went: %d %s", code, body)
	}

	// The volume's node dies: its volume is refused by name, not placed
	// elsewhere.
	byName[nv].Kill()
	clustertest.Poll(t, 2*time.Minute, "a create mounting the volume is refused naming it and its node", func(ctx context.Context) (bool, string) {
		code, body := call(t, "POST", gw2.URL+"/sandboxes", alpha, `{"templateID":"base","volumeMounts":[{"name":"shared","path":"/mnt/shared"}]}`)
		if code/100 == 2 {
			var sb struct {
				SandboxID string `json:"sandboxID"`
			}
			_ = json.Unmarshal([]byte(body), &sb)
			mu.Lock()
			ids = append(ids, sb.SandboxID)
			mu.Unlock()
			if nodeOf(sb.SandboxID) != nv {
				t.Fatalf("a create mounting the volume of a dead node went to another node: %s", body)
			}
		}
		return code == http.StatusServiceUnavailable && strings.Contains(body, `volume \"shared\"`) && strings.Contains(body, nv), fmt.Sprintf("%d %s", code, body)
	})
	// gw-1's view of the Leases may be a fraction of a second older.
	clustertest.Poll(t, time.Minute, "GET /volumes/shared through gw-1 names the dead node", func(ctx context.Context) (bool, string) {
		code, body := get(t, gw1.URL+"/volumes/shared", alpha)
		return code == http.StatusServiceUnavailable && strings.Contains(body, nv), fmt.Sprintf("%d %s", code, body)
	})
	if code, body := get(t, gw1.URL+"/volumes", alpha); code != http.StatusOK || !strings.Contains(body, `"unavailable"`) || !strings.Contains(body, vol.VolumeID) {
		t.Errorf("GET /volumes with the volume's node dead: %d %s", code, body)
	}
	if code, body := get(t, gw1.URL+"/volumes", beta); code != http.StatusOK || strings.TrimSpace(body) != "[]" {
		t.Errorf("another team's GET /volumes with the volume's node dead: %d %s", code, body)
	}
	// Where a volume is, and that it exists, is its owner's to know: only
	// the node checks a volume token, so with the node dead anyone but a
	// key of the owner's team gets the unknown volume's 404.
	content := "/volumecontent/" + vol.VolumeID + "/file?path=/hello.txt"
	if code, body := get(t, gw2.URL+content, alpha); code != http.StatusServiceUnavailable || !strings.Contains(body, nv) {
		t.Errorf("the owner's volumecontent with the node dead: %d %s", code, body)
	}
	_, foreign = get(t, gw2.URL+content, beta)
	if strings.ReplaceAll(foreign, vol.VolumeID, unknown) != unknownBody {
		t.Errorf("another team's volumecontent with the node dead: %s, an unknown volume's %s", foreign, unknownBody)
	}
}

type event struct {
	ID        string    `json:"id"`
	SandboxID string    `json:"sandbox_id"`
	Timestamp time.Time `json:"timestamp"`
}

func eventsOf(t *testing.T, code int, body string) []event {
	t.Helper()
	var evs []event
	if code != http.StatusOK || json.NewDecoder(bytes.NewReader([]byte(body))).Decode(&evs) != nil {
		t.Fatalf("events: %d %s", code, body)
	}
	return evs
}

// TestClusterRoutesSDK: compat/e2b's volume and events suites — the real
// e2b@2.51.0 Volume class (create, getInfo, list, the file API with the
// volume token, volumeMounts at Sandbox.create, another team's key and
// token refused) and the lifecycle events and signed webhook deliveries —
// and the SDK suite's snapshot step (createSnapshot, listSnapshots, a create
// from the snapshot, fork, deleteSnapshot → true then false) pass through a
// gateway in front of two nodes as they pass against one daemon.
func TestClusterRoutesSDK(t *testing.T) {
	const ns = "cella-routes-sdk"
	cp, cl := clustertest.StartIn(t, ns)
	// The flags compat/e2b/run.sh gives its daemon.
	args := []string{"--webhook-allow=127.0.0.1", "--egress-allow=*.test", "--egress-resolve=*.test=127.0.0.1"}
	nodeA := cp.StartNode(t, clustertest.NodeOptions{Name: "node-a", Namespace: ns, Args: args})
	cp.StartNode(t, clustertest.NodeOptions{Name: "node-b", Namespace: ns, Args: args})
	gw := cp.StartGateway(t, "gw-1", ns)
	clustertest.WaitLive(t, cl, ns, 2)
	admin := nodeA.AdminKey(t)
	runSuite(t, "volume.test.mjs", gw.URL, admin, "")
	runSuite(t, "events.test.mjs", gw.URL, admin, "")
	runSuite(t, "sdk.test.mjs", gw.URL, admin, "step 17: createSnapshot")
}
