package gateway_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// TestGateway: a real API server, two `cella serve --cluster` nodes and a
// `cella gateway`, all processes. Both nodes join (Leases with capacity)
// and share the cluster's admin key; a create through the gateway lands on
// a node, which records it; an exec through the gateway runs in it (envd's
// Connect protocol through both proxies); a kill through the gateway
// removes it and its record; and once its node is killed with SIGKILL, a
// sandbox is reported lost with its node and reason, never routed.
func TestGateway(t *testing.T) {
	const ns = "cella-gw"
	cp, cl := clustertest.StartIn(t, ns)
	nodeA := cp.StartNode(t, clustertest.NodeOptions{Name: "node-a", Namespace: ns})
	nodeB := cp.StartNode(t, clustertest.NodeOptions{Name: "node-b", Namespace: ns})
	gw := cp.StartGateway(t, "gw-1", ns)

	clustertest.WaitLive(t, cl, ns, 2)
	key := nodeA.AdminKey(t)
	if kb := nodeB.AdminKey(t); kb != key {
		t.Fatalf("the nodes have different admin keys: the cluster's Secret was not shared")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := client.New(client.Config{URL: gw.URL, APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: new(int64(300))})
	if err != nil {
		t.Fatalf("create through the gateway: %v", err)
	}
	records := cluster.NewRecords(cl, ns)
	var rec *v1alpha1.Sandbox
	clustertest.Poll(t, 2*time.Minute, "the node records the sandbox", func(ctx context.Context) (bool, string) {
		rec, err = records.Sandbox(ctx, sb.SandboxID)
		if err != nil {
			return false, err.Error()
		}
		return rec.Status.Phase == v1alpha1.SandboxRunning, fmt.Sprintf("%+v", rec.Status)
	})
	home, other := nodeA, nodeB
	if rec.Spec.Node == nodeB.Name {
		home, other = nodeB, nodeA
	} else if rec.Spec.Node != nodeA.Name {
		t.Fatalf("recorded on node %q, neither of ours", rec.Spec.Node)
	}
	if rec.Spec.Team == "" || rec.Spec.Template != "base" {
		t.Errorf("record spec %+v: want the owner's team and template base", rec.Spec)
	}
	// The sandbox is on exactly that node.
	if code := status(t, home.URL+"/sandboxes/"+sb.SandboxID, key); code != http.StatusOK {
		t.Errorf("its node answers %d for it", code)
	}
	if code := status(t, other.URL+"/sandboxes/"+sb.SandboxID, key); code != http.StatusNotFound {
		t.Errorf("the other node answers %d for it, want 404", code)
	}

	conn, err := c.Sandbox(ctx, sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	res, err := conn.Exec(ctx, "echo hello from $(hostname)", client.ExecOptions{})
	if err != nil {
		t.Fatalf("exec through the gateway: %v", err)
	}
	if res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "hello from ") {
		t.Fatalf("exec: %+v", res)
	}

	// A second sandbox for the kill -9 below, then this one killed through
	// the gateway: gone from its node and from the records.
	sb2, err := c.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: new(int64(300))})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(ctx, sb.SandboxID); err != nil {
		t.Fatalf("kill through the gateway: %v", err)
	}
	clustertest.Poll(t, 2*time.Minute, "the record of the killed sandbox goes", func(ctx context.Context) (bool, string) {
		_, err := records.Sandbox(ctx, sb.SandboxID)
		return errdefs.Is(err, errdefs.KindNotFound), fmt.Sprint(err)
	})

	var rec2 *v1alpha1.Sandbox
	clustertest.Poll(t, 2*time.Minute, "the second sandbox is recorded", func(ctx context.Context) (bool, string) {
		rec2, err = records.Sandbox(ctx, sb2.SandboxID)
		return err == nil, fmt.Sprint(err)
	})
	victim := nodeA
	if rec2.Spec.Node == nodeB.Name {
		victim = nodeB
	}
	victim.Kill()
	clustertest.Poll(t, 2*time.Minute, "the gateway reports the sandbox of a dead node lost", func(ctx context.Context) (bool, string) {
		code, body := get(t, gw.URL+"/sandboxes/"+sb2.SandboxID, key)
		return code == http.StatusServiceUnavailable && strings.Contains(body, victim.Name), fmt.Sprintf("%d %s", code, body)
	})
	// What the gateway knows of a lost sandbox is its owner's: another
	// team's key is told it does not exist.
	stranger := newKey(t, gw.URL, key, "other", "other-team")
	if code, body := get(t, gw.URL+"/sandboxes/"+sb2.SandboxID, stranger); code != http.StatusNotFound {
		t.Errorf("another team reads the lost sandbox: %d %s, want 404", code, body)
	}
	clustertest.Poll(t, 2*time.Minute, "its record says Lost", func(ctx context.Context) (bool, string) {
		r, err := records.Sandbox(ctx, sb2.SandboxID)
		if err != nil {
			return false, err.Error()
		}
		return r.Status.Phase == v1alpha1.SandboxLost && strings.Contains(r.Status.Message, victim.Name), fmt.Sprintf("%+v", r.Status)
	})
	// New sandboxes go to the live node only.
	sb3, err := c.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: new(int64(300))})
	if err != nil {
		t.Fatalf("create with one node dead: %v", err)
	}
	survivor := nodeA
	if victim == nodeA {
		survivor = nodeB
	}
	if code := status(t, survivor.URL+"/sandboxes/"+sb3.SandboxID, key); code != http.StatusOK {
		t.Errorf("the create did not land on the live node %s (%d)", survivor.Name, code)
	}
	if err := c.Kill(ctx, sb3.SandboxID); err != nil {
		t.Fatal(err)
	}

	// The dead node's sandbox still runs on the host (a kill -9 of a daemon
	// leaves its sandboxes for the next one): a new daemon on its data dir
	// adopts it and records it Running again, and its SIGTERM at cleanup
	// removes it.
	cp.StartNode(t, clustertest.NodeOptions{Name: victim.Name, Namespace: ns, DataDir: victim.DataDir})
	clustertest.Poll(t, 2*time.Minute, "the restarted node records its sandbox Running again", func(ctx context.Context) (bool, string) {
		r, err := records.Sandbox(ctx, sb2.SandboxID)
		if err != nil {
			return false, err.Error()
		}
		return r.Status.Phase == v1alpha1.SandboxRunning, fmt.Sprintf("%+v", r.Status)
	})
}

func get(t *testing.T, url, key string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func status(t *testing.T, url, key string) int {
	code, _ := get(t, url, key)
	return code
}
