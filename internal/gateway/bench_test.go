package gateway_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/bench"
	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
)

// TestBenchCluster: `cella bench cluster` against a real cluster (a node
// and a gateway, the admin key and the node found through --cluster)
// measures every create both ways and prints each figure beside its
// baseline. It asserts that the bench ran, not what it measured.
func TestBenchCluster(t *testing.T) {
	const ns = "cella-bench"
	cp, cl := clustertest.StartIn(t, ns)
	cp.StartNode(t, clustertest.NodeOptions{Name: "node-a", Namespace: ns})
	gw := cp.StartGateway(t, "gw-1", ns)
	clustertest.WaitLive(t, cl, ns, 1)
	cella, _ := daemontest.Binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, cella, "bench", "cluster", "--json", "--n=3",
		"--gateway="+gw.URL, "--cluster="+cp.Kubeconfig(t), "--cluster-namespace="+ns).Output()
	if err != nil {
		t.Fatalf("cella bench cluster: %v\n%s", err, out)
	}
	var figs []bench.Figure
	if err := json.Unmarshal(out, &figs); err != nil {
		t.Fatalf("its JSON: %v\n%s", err, out)
	}
	if len(figs) != 4 {
		t.Fatalf("%d figures, want 4: %+v", len(figs), figs)
	}
	for i, f := range figs {
		if f.N != 3 || f.Err != "" || f.P50 <= 0 {
			t.Errorf("figure %q: n=%d p50=%v err=%q; want 3 measured creates", f.Name, f.N, f.P50, f.Err)
		}
		if i%2 == 1 && (f.Baseline != figs[i-1].Name || f.Ratio <= 0) {
			t.Errorf("figure %q is not beside its baseline %q (ratio %v)", f.Name, figs[i-1].Name, f.Ratio)
		}
	}
	t.Logf("measured on a loaded machine: through the gateway %v vs directly %v (create → exec p50, ratio %.2f)", figs[1].P50, figs[0].P50, figs[1].Ratio)
}
