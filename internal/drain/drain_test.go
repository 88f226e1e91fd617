package drain_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
)

// TestNodeDrain: `cella node ls` shows both nodes live with their
// capacity; `cella node drain node-a` pauses every running sandbox of
// node-a (and only those) and marks it drained, which `node ls` shows;
// creates through the gateway then all go to node-b; a drained node's
// paused sandbox resumes on connect; `cella node undrain` makes it live
// again.
func TestNodeDrain(t *testing.T) {
	const ns = "cella-drain"
	cp, cl := clustertest.StartIn(t, ns)
	nodeA := cp.StartNode(t, clustertest.NodeOptions{Name: "node-a", Namespace: ns})
	nodeB := cp.StartNode(t, clustertest.NodeOptions{Name: "node-b", Namespace: ns})
	gw := cp.StartGateway(t, "gw-1", ns)
	admin := nodeA.AdminKey(t)
	cella, _ := daemontest.Binaries(t)
	kubeconfig := cp.Kubeconfig(t)
	cli := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, cella, append([]string{"node"}, append(args, "--cluster="+kubeconfig, "--cluster-namespace="+ns)...)...).CombinedOutput()
		return string(out), err
	}
	type row struct {
		Name, State string
		Capacity    cluster.Capacity
	}
	nodeLs := func() map[string]row {
		t.Helper()
		out, err := cli("ls", "--json")
		if err != nil {
			t.Fatalf("cella node ls: %v\n%s", err, out)
		}
		var rows []row
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("cella node ls --json: %v\n%s", err, out)
		}
		m := map[string]row{}
		for _, r := range rows {
			m[r.Name] = r
		}
		return m
	}
	clustertest.Poll(t, 2*time.Minute, "node ls shows both live", func(ctx context.Context) (bool, string) {
		m := nodeLs()
		return m["node-a"].State == "live" && m["node-b"].State == "live" && m["node-a"].Capacity.MemoryTotalBytes > 0, fmt.Sprint(m)
	})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	on := func(p *clustertest.Proc) *client.Client {
		c, err := client.New(client.Config{URL: p.URL, APIKey: admin})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := on(nodeA), on(nodeB)
	var onA []string
	for range 2 {
		sb, err := a.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: new(int64(600))})
		if err != nil {
			t.Fatal(err)
		}
		onA = append(onA, sb.SandboxID)
		id := sb.SandboxID
		t.Cleanup(func() { _ = a.Kill(context.Background(), id) }) // a paused one outlives the daemon
	}
	sbB, err := b.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: new(int64(600))})
	if err != nil {
		t.Fatal(err)
	}

	out, err := cli("drain", "node-a")
	if err != nil {
		t.Fatalf("cella node drain node-a: %v\n%s", err, out)
	}
	for _, id := range onA {
		if !strings.Contains(out, id+"\tpaused") {
			t.Errorf("drain's output does not say %s was paused:\n%s", id, out)
		}
		if d, err := a.Get(ctx, id); err != nil || d.State != "paused" {
			t.Errorf("after the drain, %s on node-a is %q (%v), want paused", id, d.State, err)
		}
	}
	if d, err := b.Get(ctx, sbB.SandboxID); err != nil || d.State != "running" {
		t.Errorf("node-b's sandbox after draining node-a: %q %v, want running", d.State, err)
	}
	if m := nodeLs(); m["node-a"].State != "drained" || m["node-b"].State != "live" {
		t.Errorf("node ls after the drain: %+v", m)
	}
	// The mark survives the node's own renewals.
	marked := renewedAt(t, cl, ns, "node-a")
	clustertest.Poll(t, time.Minute, "node-a renews twice after the drain", func(ctx context.Context) (bool, string) {
		n := renewedAt(t, cl, ns, "node-a")
		return n.After(marked.Add(time.Second)), fmt.Sprint(n)
	})
	if m := nodeLs(); m["node-a"].State != "drained" {
		t.Errorf("the drain mark was lost to a renewal: %+v", m["node-a"])
	}

	g, err := client.New(client.Config{URL: gw.URL, APIKey: admin})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		sb, err := g.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: new(int64(300))})
		if err != nil {
			t.Fatalf("create %d through the gateway with node-a drained: %v", i, err)
		}
		if _, err := b.Get(ctx, sb.SandboxID); err != nil {
			t.Errorf("create %d went elsewhere than node-b: %v", i, err)
		}
		_ = g.Kill(ctx, sb.SandboxID)
	}

	// Resumed on connect, through the gateway (without an archive store,
	// on its own node).
	if _, resumed, err := g.ConnectResumed(ctx, onA[0]); err != nil || !resumed {
		t.Fatalf("connect to a drained node's paused sandbox: resumed=%v %v", resumed, err)
	}
	if out, err := cli("undrain", "node-a"); err != nil {
		t.Fatalf("cella node undrain: %v\n%s", err, out)
	}
	if m := nodeLs(); m["node-a"].State != "live" {
		t.Errorf("node ls after undrain: %+v", m["node-a"])
	}
	if out, err := cli("drain", "no-such-node"); err == nil || !strings.Contains(out, "no-such-node") {
		t.Errorf("drain of an unknown node: %v\n%s", err, out)
	}
}

func renewedAt(t *testing.T, cl ctrlclient.Client, ns, name string) time.Time {
	t.Helper()
	nodes, err := cluster.Nodes(context.Background(), cl, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Name == name {
			return n.RenewedAt
		}
	}
	t.Fatalf("no node %s", name)
	return time.Time{}
}
