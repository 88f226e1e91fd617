package gateway_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/daemon/conformance"
	"github.com/cella-sandbox/cella/internal/drain"
	"github.com/cella-sandbox/cella/internal/errdefs"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
)

// TestCrossNodeResume: a sandbox outlives its node. Two `cella serve
// --cluster --archive` nodes, a gateway and a real S3 server (versitygw),
// all processes on loopback. A sandbox created through the gateway on node
// A runs a background counter and holds a file; a pause through the
// gateway archives it (its record says so); A is killed with SIGKILL; a
// connect through the gateway resumes it on node B — the gateway picks B
// because A's Lease lapsed, B imports it from the archive and its record's
// node moves to B — and the counter goes on from where it was, the file
// is there, every later request goes to B. Node B drained (cella node
// drain) pauses it into the archive and its next connect resumes it on
// node C; B forgets its copy. Paused on C and C killed, a kill through the
// gateway goes to B (undrained), which empties the bucket; the record
// goes.
func TestCrossNodeResume(t *testing.T) {
	const ns = "cella-archive"
	ac := startArchived(t, ns) // resumeabort_test.go
	srv, cl, nodeA, key, c := ac.srv, ac.cl, ac.nodeA, ac.key, ac.c

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	id := ac.create(ctx, t)
	sb, err := c.Sandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Exec(ctx, "echo moved-with-it > /home/user/kept", client.ExecOptions{Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
		t.Fatalf("write a file: %+v %v", res, err)
	}
	conformance.StartCounter(t, sb)
	n := conformance.WaitCountAbove(t, sb, 3)

	// Node B joins only now, so the create could only go to A.
	nodeB := ac.startNode(t, "node-b")
	waitLive(t, cl, ns, 2)
	if kb := nodeB.AdminKey(t); kb != key {
		t.Fatal("the nodes have different admin keys")
	}

	records := cluster.NewRecords(cl, ns)
	ac.pause(ctx, t, records, id, "node-a")
	if keys := srv.Keys(t, "/agents/"); len(keys) != 2 {
		t.Fatalf("objects in the archive after the pause: %v", keys)
	}

	nodeA.Kill()
	clustertest.Poll(t, time.Minute, "node-a's lease lapses", func(ctx context.Context) (bool, string) {
		nodes, err := cluster.Nodes(ctx, cl, ns)
		if err != nil {
			return false, err.Error()
		}
		for _, n := range nodes {
			if n.Name == "node-a" {
				return !n.Live, fmt.Sprintf("%+v", n)
			}
		}
		return true, "gone"
	})

	start := time.Now()
	if _, err := c.Connect(ctx, id); err != nil {
		t.Fatalf("connect through the gateway once node-a is dead: %v\nnode-b log:\n%s", err, tailOf(nodeB.Log, 3000))
	}
	t.Logf("cross-node resume (connect through the gateway, archive pulled, checkpoint restored): %v", time.Since(start).Round(time.Millisecond))
	rec, err := records.Sandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Spec.Node != "node-b" || rec.Labels[cluster.LabelNode] != "node-b" {
		t.Fatalf("the record did not move to node-b: %+v %v", rec.Spec, rec.Labels)
	}
	sb, err = c.Sandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	conformance.WaitCountAbove(t, sb, n)
	if res, err := sb.Exec(ctx, "cat /home/user/kept", client.ExecOptions{Timeout: time.Minute}); err != nil || res.Stdout != "moved-with-it\n" {
		t.Fatalf("the file after the move: %+v %v", res, err)
	}
	// The sandbox's trust store (in its layer, made on node-a) names the
	// CA node-b's egress proxy signs with: the cluster's.
	caB, err := os.ReadFile(filepath.Join(nodeB.DataDir, "egress-ca", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if caA, err := os.ReadFile(filepath.Join(nodeA.DataDir, "egress-ca", "ca.pem")); err != nil || string(caA) != string(caB) {
		t.Fatalf("node-a and node-b sign egress with different CAs (%v)", err)
	}
	if res, err := sb.Exec(ctx, "cat /etc/cella/egress-ca.pem", client.ExecOptions{Timeout: time.Minute}); err != nil || res.Stdout != string(caB) {
		t.Fatalf("the moved sandbox trusts another CA than node-b's proxy: %+v %v", res, err)
	}
	if keys := srv.Keys(t, "/agents/"); len(keys) != 0 {
		t.Fatalf("objects left once the sandbox runs on node-b: %v", keys)
	}
	if _, err := os.Stat(filepath.Join(nodeB.DataDir, "sandboxes", id)); err != nil {
		t.Fatalf("node-b did not adopt the sandbox into its data dir: %v", err)
	}
	clustertest.Poll(t, time.Minute, "node-b records it running", func(ctx context.Context) (bool, string) {
		rec, err := records.Sandbox(ctx, id)
		if err != nil {
			return false, err.Error()
		}
		return rec.Spec.Node == "node-b" && rec.Status.Phase == v1alpha1.SandboxRunning && !rec.Status.Archived, fmt.Sprintf("%+v %+v", rec.Spec, rec.Status)
	})

	// Node-b drained (cella node drain): its running sandbox is paused
	// into the archive, and its next connect resumes it on node-c; node-b
	// forgets its copy.
	nodeC := ac.startNode(t, "node-c")
	waitLive(t, cl, ns, 2)
	n = conformance.WaitCountAbove(t, sb, n)
	res, err := drain.Drain(ctx, drain.Config{Kube: cl, Namespace: ns, Node: "node-b"})
	if err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("drain node-b: %+v %v", res, err)
	}
	clustertest.Poll(t, time.Minute, "the record says archived on node-b", func(ctx context.Context) (bool, string) {
		rec, err := records.Sandbox(ctx, id)
		if err != nil {
			return false, err.Error()
		}
		return rec.Spec.Node == "node-b" && rec.Status.Archived, fmt.Sprintf("%+v %+v", rec.Spec, rec.Status)
	})
	if _, err := c.Connect(ctx, id); err != nil {
		t.Fatalf("connect through the gateway once node-b is drained: %v\nnode-c log:\n%s", err, tailOf(nodeC.Log, 3000))
	}
	sb, err = c.Sandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	conformance.WaitCountAbove(t, sb, n)
	if rec, err := records.Sandbox(ctx, id); err != nil || rec.Spec.Node != "node-c" {
		t.Fatalf("after the drain the record is %+v, %v; want it on node-c", rec, err)
	}
	clustertest.Poll(t, time.Minute, "node-b forgets its copy", func(ctx context.Context) (bool, string) {
		_, err := os.Stat(filepath.Join(nodeB.DataDir, "sandboxes", id))
		return os.IsNotExist(err), fmt.Sprint(err)
	})

	// Paused on node-c, node-c killed: a kill through the gateway goes to
	// node-b once it is undrained, which deletes the archive; the record
	// goes with node-b's next sync.
	if err := c.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	if keys := srv.Keys(t, "/agents/"); len(keys) != 2 {
		t.Fatalf("objects after the pause on node-c: %v", keys)
	}
	clustertest.Poll(t, time.Minute, "the record says archived on node-c", func(ctx context.Context) (bool, string) {
		rec, err := records.Sandbox(ctx, id)
		if err != nil {
			return false, err.Error()
		}
		return rec.Spec.Node == "node-c" && rec.Status.Archived, fmt.Sprintf("%+v %+v", rec.Spec, rec.Status)
	})
	nodeC.Kill()
	if err := drain.Undrain(ctx, cl, ns, "node-b"); err != nil {
		t.Fatal(err)
	}
	clustertest.Poll(t, time.Minute, "node-c lapsed, node-b placing again", func(ctx context.Context) (bool, string) {
		nodes, err := cluster.Nodes(ctx, cl, ns)
		if err != nil {
			return false, err.Error()
		}
		ok := 0
		for _, n := range nodes {
			if (n.Name == "node-c" && !n.Live) || (n.Name == "node-b" && n.Live && !n.Drained()) {
				ok++
			}
		}
		return ok == 2, fmt.Sprintf("%+v", nodes)
	})
	if err := c.Kill(ctx, id); err != nil {
		t.Fatalf("kill through the gateway of an archived sandbox whose node is dead: %v", err)
	}
	if keys := srv.Keys(t, "/agents/"); len(keys) != 0 {
		t.Fatalf("objects left after the kill: %v", keys)
	}
	clustertest.Poll(t, time.Minute, "the killed sandbox's record goes", func(ctx context.Context) (bool, string) {
		rec, err := records.Sandbox(ctx, id)
		if errdefs.Is(err, errdefs.KindNotFound) {
			return true, ""
		}
		return false, fmt.Sprintf("%+v %v", rec, err)
	})
}

func waitLive(t *testing.T, c crclient.Client, ns string, want int) {
	t.Helper()
	clustertest.Poll(t, 2*time.Minute, fmt.Sprintf("%d nodes live", want), func(ctx context.Context) (bool, string) {
		nodes, err := cluster.Nodes(ctx, c, ns)
		if err != nil {
			return false, err.Error()
		}
		live := 0
		for _, n := range nodes {
			if n.Live && n.Capacity.MemoryFreeBytes > 0 {
				live++
			}
		}
		return live == want, fmt.Sprintf("%+v", nodes)
	})
}

func tailOf(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}
