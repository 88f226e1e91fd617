package gateway_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
)

// TestCluster is the cluster of issue 14 on one host: the real API
// server, three `cella serve --cluster` nodes and two gateways, all
// processes.
//   - Creates spread: six creates, alternating gateways, land on all
//     three nodes.
//   - The real E2B SDKs (compat/e2b's sdk suite, its core steps) pass
//     through either gateway.
//   - kill -9 of a node: its Lease lapses, its sandboxes are reported lost
//     (REST 503 naming the node, listed lost), creates go to the others.
//   - A gateway killed with SIGKILL in the middle of a request: that
//     request fails, the other gateway serves everything.
//   - Two daemons on one host never reap each other's resources: a fresh
//     node started while the killed node's sandbox still runs leaves it
//     alone (its runsc keeps running), and a daemon restarted on the dead
//     node's data dir adopts it and runs commands in it again.
func TestCluster(t *testing.T) {
	const ns = "cella-cluster"
	cp, cl := clustertest.StartIn(t, ns)
	nodes := map[string]*clustertest.Proc{}
	for _, name := range []string{"node-a", "node-b", "node-c"} {
		nodes[name] = cp.StartNode(t, clustertest.NodeOptions{Name: name, Namespace: ns})
	}
	gw1 := cp.StartGateway(t, "gw-1", ns)
	gw2 := cp.StartGateway(t, "gw-2", ns)
	admin := nodes["node-a"].AdminKey(t)
	clustertest.WaitLive(t, cl, ns, 3)
	records := cluster.NewRecords(cl, ns)

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	gwc := func(g *clustertest.Proc) *client.Client {
		c, err := client.New(client.Config{URL: g.URL, APIKey: admin})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c1, c2 := gwc(gw1), gwc(gw2)
	var ids []string
	t.Cleanup(func() {
		for _, id := range ids {
			_ = c2.Kill(context.Background(), id)
		}
	})

	// Creates spread.
	nodeOf := map[string]string{}
	for i := range 6 {
		c := []*client.Client{c1, c2}[i%2]
		sb, err := c.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: new(int64(900))})
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		ids = append(ids, sb.SandboxID)
		clustertest.Poll(t, time.Minute, "the create recorded", func(ctx context.Context) (bool, string) {
			rec, err := records.Sandbox(ctx, sb.SandboxID)
			if err != nil {
				return false, err.Error()
			}
			nodeOf[sb.SandboxID] = rec.Spec.Node
			return true, ""
		})
	}
	used := map[string]int{}
	for _, n := range nodeOf {
		used[n]++
	}
	if len(used) != 3 {
		t.Errorf("six creates landed on %v; want all three nodes", used)
	}

	// The E2B SDKs' core steps through each gateway.
	runSDK(t, gw1.URL, admin, `step (1|2|3|4|5|6|7|10|12):`)
	runSDK(t, gw2.URL, admin, `step (1|2|3|4|10|12):`)

	// kill -9 of a node.
	victim := nodeOf[ids[0]]
	var victimIDs []string
	for _, id := range ids {
		if nodeOf[id] == victim {
			victimIDs = append(victimIDs, id)
		}
	}
	nodes[victim].Kill()
	clustertest.Poll(t, 2*time.Minute, victim+"'s sandbox reported lost", func(ctx context.Context) (bool, string) {
		code, body := get(t, gw2.URL+"/sandboxes/"+victimIDs[0], admin)
		return code == 503 && strings.Contains(body, victim), fmt.Sprintf("%d %s", code, body)
	})
	clustertest.Poll(t, time.Minute, "all of "+victim+"'s records Lost", func(ctx context.Context) (bool, string) {
		for _, id := range victimIDs {
			rec, err := records.Sandbox(ctx, id)
			if err != nil || rec.Status.Phase != v1alpha1.SandboxLost {
				return false, fmt.Sprint(id, rec, err)
			}
		}
		return true, ""
	})
	listed, err := c1.ListStates(ctx, "running,paused,lost")
	if err != nil {
		t.Fatal(err)
	}
	lostListed := 0
	for _, d := range listed {
		if slices.Contains(victimIDs, d.SandboxID) {
			lostListed++
			if d.State != "lost" {
				t.Errorf("%s of the dead node listed %q, want lost", d.SandboxID, d.State)
			}
		}
	}
	if lostListed != len(victimIDs) {
		t.Errorf("%d of the dead node's %d sandboxes listed with state=running,paused,lost", lostListed, len(victimIDs))
	}
	for i := range 3 {
		sb, err := []*client.Client{c1, c2}[i%2].Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: new(int64(900))})
		if err != nil {
			t.Fatalf("create %d with %s dead: %v", i, victim, err)
		}
		ids = append(ids, sb.SandboxID)
		clustertest.Poll(t, time.Minute, "the create recorded", func(ctx context.Context) (bool, string) {
			rec, err := records.Sandbox(ctx, sb.SandboxID)
			if err == nil && rec.Spec.Node == victim {
				t.Errorf("a create went to the dead node %s", victim)
			}
			return err == nil, fmt.Sprint(err)
		})
	}

	// A gateway killed mid-request.
	var live string
	for _, id := range ids {
		if nodeOf[id] != victim && nodeOf[id] != "" {
			live = id
			break
		}
	}
	conn1, err := c1.Sandbox(ctx, live)
	if err != nil {
		t.Fatal(err)
	}
	conn2, err := c2.Sandbox(ctx, live)
	if err != nil {
		t.Fatal(err)
	}
	inflight := make(chan error, 1)
	go func() {
		_, err := conn1.Exec(ctx, "touch /tmp/inflight; sleep 120; echo finished", client.ExecOptions{})
		inflight <- err
	}()
	clustertest.Poll(t, 2*time.Minute, "the long command runs through gw-1", func(ctx context.Context) (bool, string) {
		r, err := conn2.Exec(ctx, "test -f /tmp/inflight && echo yes", client.ExecOptions{})
		return err == nil && strings.TrimSpace(r.Stdout) == "yes", fmt.Sprint(r, err)
	})
	gw1.Kill()
	select {
	case err := <-inflight:
		if err == nil {
			t.Errorf("the request through the killed gateway finished as if nothing happened")
		}
	case <-time.After(time.Minute):
		t.Errorf("the request through the killed gateway still hangs a minute after its gateway died")
	}
	if r, err := conn2.Exec(ctx, "echo still here", client.ExecOptions{}); err != nil || strings.TrimSpace(r.Stdout) != "still here" {
		t.Errorf("exec through gw-2 after gw-1 died: %+v %v", r, err)
	}
	sb, err := c2.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: new(int64(900))})
	if err != nil {
		t.Errorf("create through gw-2 after gw-1 died: %v", err)
	} else {
		ids = append(ids, sb.SandboxID)
	}

	// Two daemons on one host: the dead node's sandbox still runs, and a
	// new daemon starting (with its own orphan sweeps) leaves it alone.
	dead := nodes[victim]
	if !runscOf(t, dead.DataDir) {
		t.Fatalf("no runsc of %s's sandboxes runs after its daemon was killed", victim)
	}
	cp.StartNode(t, clustertest.NodeOptions{Name: "node-d", Namespace: ns})
	clustertest.WaitLive(t, cl, ns, 3) // a, b (or c) and d: the victim's Lease has lapsed
	if !runscOf(t, dead.DataDir) {
		t.Errorf("starting node-d stopped %s's sandboxes", victim)
	}
	cp.StartNode(t, clustertest.NodeOptions{Name: victim, Namespace: ns, DataDir: dead.DataDir})
	clustertest.Poll(t, 2*time.Minute, victim+" restarted records its sandboxes Running", func(ctx context.Context) (bool, string) {
		for _, id := range victimIDs {
			rec, err := records.Sandbox(ctx, id)
			if err != nil || rec.Status.Phase != v1alpha1.SandboxRunning {
				return false, fmt.Sprint(id, rec, err)
			}
		}
		return true, ""
	})
	conn, err := c2.Sandbox(ctx, victimIDs[0])
	if err != nil {
		t.Fatal(err)
	}
	if r, err := conn.Exec(ctx, "echo back", client.ExecOptions{}); err != nil || strings.TrimSpace(r.Stdout) != "back" {
		t.Errorf("exec in the adopted sandbox: %+v %v", r, err)
	}
}

// runscOf reports whether a runsc process of a sandbox under dataDir runs.
func runscOf(t *testing.T, dataDir string) bool {
	t.Helper()
	out, _ := exec.Command("pgrep", "-f", "runsc.*"+dataDir).Output()
	return strings.TrimSpace(string(out)) != ""
}

// runSDK runs compat/e2b's SDK suite's tests matching pattern against the
// gateway at url (the harness's logging proxy in front of it, as for a
// daemon).
func runSDK(t *testing.T, url, key, pattern string) {
	t.Helper()
	runSuite(t, "sdk.test.mjs", url, key, pattern)
}

// runSuite runs compat/e2b's suite file's steps matching pattern (""
// every one) against the gateway at url.
func runSuite(t *testing.T, file, url, key, pattern string) {
	t.Helper()
	dir := filepath.Join(daemontest.RepoRoot(t), "compat", "e2b")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b-2.51.0")); err != nil {
		t.Fatalf("compat/e2b's SDKs are not installed (make test-cluster runs npm ci there): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	args := []string{"--test", "--test-concurrency=1", "--test-timeout=120000", "--test-reporter=spec"}
	if pattern != "" {
		args = append(args, "--test-name-pattern="+pattern)
	}
	cmd := exec.CommandContext(ctx, "node", append(args, file)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CELLA_E2B_URL="+url, "CELLA_E2B_KEY="+key)
	out, err := cmd.CombinedOutput()
	passed := strings.Count(string(out), "✔ ")
	t.Logf("E2B %s through %s (%q): %d passed", file, url, pattern, passed)
	if err != nil || passed == 0 {
		t.Errorf("E2B %s through the gateway %s: %v\n%s", file, url, err, out)
	}
}
