package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// TestVolumeCreateClientGone: a client that goes away in the middle of a
// volume create through the gateway leaves the volume made and recorded,
// routed by the gateway — never a volume on its node whose reservation
// the gateway dropped (no gateway routes it, and no later create of its
// name can replace it). The node is reached through a proxy
// (holdingProxy) that holds the create until the gateway has seen its
// client go: before the fix the gateway's own request was cancelled with
// its client's (the proxy sees it give up), the gateway dropped the
// reservation and answered nobody, and the create, already on its way,
// made the volume all the same; now the gateway says in its log that the
// create runs to its end.
func TestVolumeCreateClientGone(t *testing.T) {
	const ns = "cella-volgone"
	cp, cl := clustertest.StartIn(t, ns)
	proxy := newHoldingProxy(t, func(r *http.Request) bool {
		return r.Method == http.MethodPost && r.URL.Path == "/volumes"
	})
	node := cp.StartNode(t, clustertest.NodeOptions{Name: "node-a", Namespace: ns, Args: []string{"--advertise-url=" + proxy.URL}})
	proxy.to(t, node.URL)
	gw := cp.StartGateway(t, "gw-1", ns)
	clustertest.WaitLive(t, cl, ns, 1)
	admin := node.AdminKey(t)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	sent := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(cctx, http.MethodPost, gw.URL+"/volumes", strings.NewReader(`{"name":"kept"}`))
		if err != nil {
			sent <- err
			return
		}
		req.Header.Set("X-API-Key", admin)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("answered %d", resp.StatusCode)
		}
		sent <- err
	}()
	select {
	case <-proxy.arrived:
	case err := <-sent:
		t.Fatalf("the volume create ended (%v) before it reached the node", err)
	}
	ccancel()
	if err := <-sent; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled create: %v, want context.Canceled", err)
	}
	clustertest.Poll(t, time.Minute, "the gateway saw its client go", func(ctx context.Context) (bool, string) {
		if proxy.senderGone.Load() {
			return true, ""
		}
		log, err := os.ReadFile(gw.Log)
		return strings.Contains(string(log), "the client went away during a volume create"), fmt.Sprintf("gateway log: %v", err)
	})
	proxy.Release()

	volumes := cluster.NewVolumeRecords(cl, ns)
	var id string
	clustertest.Poll(t, time.Minute, "the volume made on node-a is recorded there", func(ctx context.Context) (bool, string) {
		code, body := call(t, "GET", node.URL+"/volumes", admin, "")
		var listed []struct {
			ID   string `json:"volumeID"`
			Name string `json:"name"`
		}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &listed) != nil {
			return false, fmt.Sprintf("node-a's GET /volumes: %d %s", code, body)
		}
		id = ""
		for _, v := range listed {
			if v.Name == "kept" {
				id = v.ID
			}
		}
		rec, err := volumes.Named(ctx, tenant.AdminTeam, "kept")
		if err != nil {
			return false, fmt.Sprintf("node-a has %q; its record: %v", id, err)
		}
		return id != "" && rec.Spec.VolumeID == id && rec.Spec.Node == "node-a", fmt.Sprintf("node-a has %q; record %+v", id, rec.Spec)
	})
	if code, body := call(t, "GET", gw.URL+"/volumes/kept", admin, ""); code != http.StatusOK || !strings.Contains(body, id) {
		t.Errorf("GET /volumes/kept through the gateway: %d %s, want 200 with %s", code, body, id)
	}
	if code, body := call(t, "DELETE", gw.URL+"/volumes/kept", admin, ""); code != http.StatusNoContent {
		t.Errorf("DELETE /volumes/kept through the gateway: %d %s", code, body)
	}
	if t.Failed() {
		t.Logf("gateway log:\n%s", tailOf(gw.Log, 4000))
	}
}
