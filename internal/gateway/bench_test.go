package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/archive/s3test"
	"github.com/cella-sandbox/cella/internal/bench"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
)

// TestBenchCluster: `cella bench cluster` against a real cluster (two
// nodes archiving to a real S3 server, a gateway, the admin key and the
// node found through --cluster) measures every create both ways, a burst
// of concurrent creates each way, and every round's resume on its own node
// and on the other, and prints each figure
// beside its baseline; the bench leaves no node drained. It asserts that
// the bench ran, not what it measured. First, with one node, the resume
// figures are no numbers but an error naming the two nodes they need.
func TestBenchCluster(t *testing.T) {
	const ns = "cella-bench"
	cp, cl := clustertest.StartIn(t, ns)
	srv := s3test.Start(t)
	archived := clustertest.NodeOptions{Namespace: ns, Env: srv.Env(),
		Args: []string{"--archive=" + srv.URL("bench"), "--archive-endpoint=" + srv.Endpoint}}
	archived.Name = "node-a"
	cp.StartNode(t, archived)
	gw := cp.StartGateway(t, "gw-1", ns)
	clustertest.WaitLive(t, cl, ns, 1)
	cella, _ := daemontest.Binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	benchCluster := func(n int) []bench.Figure {
		t.Helper()
		out, err := exec.CommandContext(ctx, cella, "bench", "cluster", "--json", fmt.Sprintf("--n=%d", n), "--concurrent=4",
			"--gateway="+gw.URL, "--cluster="+cp.Kubeconfig(t), "--cluster-namespace="+ns).Output()
		if err != nil {
			t.Fatalf("cella bench cluster: %v\n%s", err, out)
		}
		var figs []bench.Figure
		if err := json.Unmarshal(out, &figs); err != nil {
			t.Fatalf("its JSON: %v\n%s", err, out)
		}
		return figs
	}

	figs := benchCluster(1)
	if len(figs) != 8 || figs[0].N != 1 || figs[0].Err != "" || figs[4].N != 4 || figs[5].N != 4 {
		t.Fatalf("one node: want 8 figures, the creates and bursts measured: %+v", figs)
	}
	for _, f := range figs[6:] {
		if f.N != 0 || f.P50 != 0 || !strings.Contains(f.Err, "at least 2 live, undrained nodes") {
			t.Errorf("one node: figure %q: n=%d p50=%v err=%q; want no number and an error naming the 2 nodes it needs", f.Name, f.N, f.P50, f.Err)
		}
	}

	archived.Name = "node-b"
	cp.StartNode(t, archived)
	clustertest.WaitLive(t, cl, ns, 2)
	figs = benchCluster(3)
	if len(figs) != 8 {
		t.Fatalf("%d figures, want 8 (4 creates, 2 bursts, 2 resumes): %+v", len(figs), figs)
	}
	for i, f := range figs {
		want := 3
		if i == 4 || i == 5 {
			want = 4 // the bursts' creates
		}
		if f.N != want || f.Err != "" || f.P50 <= 0 {
			t.Errorf("figure %q: n=%d p50=%v err=%q; want %d measured", f.Name, f.N, f.P50, f.Err, want)
		}
		if i%2 == 1 && (f.Baseline != figs[i-1].Name || f.Ratio <= 0) {
			t.Errorf("figure %q is not beside its baseline %q (ratio %v)", f.Name, figs[i-1].Name, f.Ratio)
		}
	}
	nodes, err := cluster.Nodes(ctx, cl, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Drained() {
			t.Errorf("node %s left drained by the bench", n.Name)
		}
	}

	// Interrupted while a round has a node marked drained, the bench
	// removes the mark before it exits.
	cmd := exec.CommandContext(ctx, cella, "bench", "cluster", "--json", "--n=50", "--concurrent=4",
		"--gateway="+gw.URL, "--cluster="+cp.Kubeconfig(t), "--cluster-namespace="+ns)
	var interrupted strings.Builder
	cmd.Stdout, cmd.Stderr = &interrupted, &interrupted
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	clustertest.Poll(t, 5*time.Minute, "a node marked drained by the bench", func(ctx context.Context) (bool, string) {
		nodes, err := cluster.Nodes(ctx, cl, ns)
		for _, n := range nodes {
			if n.Drained() {
				return true, ""
			}
		}
		return false, fmt.Sprint(nodes, err)
	})
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // an interrupted bench's exit status is an error
	if nodes, err = cluster.Nodes(ctx, cl, ns); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Drained() {
			t.Errorf("node %s left drained by the interrupted bench; it said:\n%s", n.Name, interrupted.String())
		}
	}
	t.Logf("measured on a loaded machine: through the gateway %v vs directly %v (create → exec p50, ratio %.2f); a burst of %d creates through the gateway p50 %v p95 %v (%s) vs directly p50 %v p95 %v (%s); resumed on another node %v vs on its own %v (resume → exec p50, ratio %.2f)",
		figs[1].P50, figs[0].P50, figs[1].Ratio, figs[5].N, figs[5].P50, figs[5].P95, figs[5].Extra, figs[4].P50, figs[4].P95, figs[4].Extra,
		figs[7].P50, figs[6].P50, figs[7].Ratio)
}
