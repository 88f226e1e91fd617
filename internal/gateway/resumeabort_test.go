package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/archive/s3test"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/errdefs"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
)

// TestCrossNodeResumeAbandoned: a client that goes away in the middle of
// a cross-node resume leaves the sandbox in one place. A sandbox paused
// into the archive on node A, A drained, a connect through the gateway
// goes to node B; the client cancels it as soon as B's claim is visible
// (the record's node is B), while B is still importing and restoring.
// Then exactly one node holds the sandbox, where its record says, in the
// record's phase (a kill sent to node A meanwhile reports no success);
// and a kill through the gateway leaves no record, no copy on any node
// (its API and its data dir) and no objects in the bucket. (What it
// caught: B's import ran under the request's context, so the cancel
// could end it after the claim — the claim's own status update failed
// "context canceled" —; B dropped its half-made copy and its sync deleted
// the record it now held; node A had either forgotten its copy already,
// leaving the objects to nobody, or not seen the claim yet, and recorded
// its stale copy again. A kill that reached A killed that copy and
// answered 204 while B resumed the sandbox.)
func TestCrossNodeResumeAbandoned(t *testing.T) {
	const ns = "cella-resumeabort"
	ac := startArchived(t, ns)
	cl, nodeA, key, c := ac.cl, ac.nodeA, ac.key, ac.c

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	id := ac.create(ctx, t)
	if sb, err := c.Sandbox(ctx, id); err != nil {
		t.Fatal(err)
	} else if res, err := sb.Exec(ctx, "echo kept > /home/user/kept", client.ExecOptions{Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
		t.Fatalf("write a file: %+v %v", res, err)
	}

	// Node B joins only now, so the create could only go to A.
	nodeB := ac.startNode(t, "node-b")
	waitLive(t, cl, ns, 2)
	nodes := []*clustertest.Proc{nodeA, nodeB}

	records := cluster.NewRecords(cl, ns)
	ac.pause(ctx, t, records, id, "node-a")
	if err := cluster.SetDrain(ctx, cl, ns, "node-a", true); err != nil {
		t.Fatal(err)
	}

	// The connect goes to node B (node A is drained); it is cancelled
	// once B's claim shows, before B could have restored anything.
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	connected := make(chan error, 1)
	go func() {
		_, err := c.Connect(cctx, id)
		connected <- err
	}()
	for claimed := false; !claimed; {
		select {
		case err := <-connected:
			t.Fatalf("the connect ended (%v) before node-b's claim of the record was seen", err)
		default:
		}
		rec, err := records.Sandbox(ctx, id)
		if err != nil {
			t.Fatalf("read the record while node-b resumes: %v", err)
		}
		claimed = rec.Spec.Node == "node-b"
	}
	ccancel()
	if err := <-connected; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled connect: %v, want context.Canceled", err)
	}
	// A kill that reaches node A now (a gateway that read the record
	// before the claim, a client of the node) must not report the
	// sandbox killed: at most A's stale copy goes, and the sandbox is
	// node-b's.
	ca, err := client.New(client.Config{URL: nodeA.URL, APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Kill(ctx, id); err == nil {
		t.Fatal("a kill on node-a of the sandbox node-b claimed reported it killed")
	} else {
		t.Logf("a kill on node-a once node-b claimed it: %v", err)
	}
	// As `cella bench cluster` does after its round: the mark goes.
	if err := cluster.SetDrain(ctx, cl, ns, "node-a", false); err != nil {
		t.Fatal(err)
	}

	// Settled: one node holds it, the one its record names, in the
	// record's phase.
	clustertest.Poll(t, 2*time.Minute, "exactly one node holds the sandbox, where its record says", func(ctx context.Context) (bool, string) {
		rec, err := records.Sandbox(ctx, id)
		if err != nil {
			return false, "record: " + err.Error() + "; " + holders(ctx, t, key, nodes, id)
		}
		var held []string
		state := ""
		for _, n := range nodes {
			if d, ok := nodeHas(ctx, t, key, n, id); ok {
				held, state = append(held, n.Name), d
			}
		}
		ok := len(held) == 1 && held[0] == rec.Spec.Node && strings.EqualFold(state, string(rec.Status.Phase))
		return ok, fmt.Sprintf("record %+v %+v; %s", rec.Spec, rec.Status, holders(ctx, t, key, nodes, id))
	})

	if err := c.Kill(ctx, id); err != nil {
		t.Fatalf("kill through the gateway: %v", err)
	}
	ac.gone(t, records, nodes, id)
	if t.Failed() {
		t.Logf("node-a log:\n%s\nnode-b log:\n%s", tailOf(nodeA.Log, 4000), tailOf(nodeB.Log, 4000))
	}
}

// TestKillFollowsCrossNodeResume: a kill through the gateway that reaches
// node A after node B claimed the sandbox for a resume — A's 409, the copy
// moved — goes again where the record routes it now, and B answers it
// while its resume is still under way: the client's kill succeeds at
// once, and nothing of the sandbox survives (no record, no copy on any
// node, no objects in the bucket). Both hops are held by proxies
// (holdingProxy), so the order is the test's: A advertises one, which
// holds the kill from when the gateway sent it (the record said A,
// undrained) until B has claimed the sandbox and its resume, A now
// drained, is downloading the state — through B's archive endpoint,
// another proxy, which holds that download until the kill has its answer.
// Before, the client got A's 409; and B's kill waited for the resume
// (opMu, up to claimedResumeTimeout), so it had no answer while the
// download was held.
func TestKillFollowsCrossNodeResume(t *testing.T) {
	const ns = "cella-killfollows"
	nodeProxy := newHoldingProxy(t, func(r *http.Request) bool {
		return r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/sandboxes/")
	})
	ac := startArchived(t, ns, "--advertise-url="+nodeProxy.URL)
	nodeProxy.to(t, ac.nodeA.URL)
	cl, nodeA, c := ac.cl, ac.nodeA, ac.c

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	id := ac.create(ctx, t)
	archiveProxy := newHoldingProxy(t, func(r *http.Request) bool {
		return r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/sandboxes/"+id+"/state")
	})
	archiveProxy.to(t, ac.srv.Endpoint)
	nodeB := ac.startNode(t, "node-b", "--archive-endpoint="+archiveProxy.URL)
	waitLive(t, cl, ns, 2)
	nodes := []*clustertest.Proc{nodeA, nodeB}
	records := cluster.NewRecords(cl, ns)
	ac.pause(ctx, t, records, id, "node-a")

	killed := make(chan error, 1)
	go func() { killed <- c.Kill(ctx, id) }()
	select {
	case <-nodeProxy.arrived:
	case err := <-killed:
		t.Fatalf("the kill ended (%v) before it reached node-a", err)
	}
	if err := cluster.SetDrain(ctx, cl, ns, "node-a", true); err != nil {
		t.Fatal(err)
	}
	connected := make(chan error, 1)
	go func() {
		_, err := c.Connect(ctx, id)
		connected <- err
	}()
	select {
	case <-archiveProxy.arrived: // node-b claimed it and downloads its state
	case err := <-connected:
		t.Fatalf("the connect ended (%v) before node-b downloaded the sandbox's state", err)
	}
	if rec, err := records.Sandbox(ctx, id); err != nil || rec.Spec.Node != "node-b" {
		t.Fatalf("node-b downloads the state, the record: %+v %v, want node-b's", rec, err)
	}
	nodeProxy.Release()
	select {
	case err := <-killed:
		if err != nil {
			t.Errorf("the kill through the gateway that reached node-a after node-b's claim: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Errorf("the kill through the gateway had no answer in 2 minutes while node-b's resume waited for its download")
	}
	archiveProxy.Release()
	t.Logf("the connect that went to node-b: %v", <-connected)
	if err := cluster.SetDrain(ctx, cl, ns, "node-a", false); err != nil {
		t.Fatal(err)
	}
	ac.gone(t, records, nodes, id)
	if t.Failed() {
		t.Logf("node-a log:\n%s\nnode-b log:\n%s", tailOf(nodeA.Log, 4000), tailOf(nodeB.Log, 4000))
	}
}

// gone waits until nothing of sandbox id is left: no record, no copy on
// any of nodes (its API and its data dir), no objects in the bucket.
func (ac archivedCluster) gone(t *testing.T, records *cluster.Records, nodes []*clustertest.Proc, id string) {
	t.Helper()
	clustertest.Poll(t, time.Minute, "no record, no copy on any node, no objects", func(ctx context.Context) (bool, string) {
		_, err := records.Sandbox(ctx, id)
		if !errdefs.Is(err, errdefs.KindNotFound) {
			return false, fmt.Sprintf("record: %v", err)
		}
		for _, n := range nodes {
			if _, ok := nodeHas(ctx, t, ac.key, n, id); ok {
				return false, holders(ctx, t, ac.key, nodes, id)
			}
		}
		if keys := ac.srv.Keys(t, "/agents/"); len(keys) != 0 {
			return false, fmt.Sprintf("objects: %v", keys)
		}
		return true, ""
	})
}

// archivedCluster is a control plane, an S3 server, the options of a
// node archiving there, node A (the only node yet, so creates go to it),
// a gateway and a client of it with the admin key.
type archivedCluster struct {
	cp    *clustertest.ControlPlane
	srv   *s3test.Server
	cl    crclient.Client
	opts  clustertest.NodeOptions
	nodeA *clustertest.Proc
	key   string
	c     *client.Client
}

// argsA are more flags of node A.
func startArchived(t *testing.T, ns string, argsA ...string) archivedCluster {
	t.Helper()
	cp := clustertest.Start(t)
	srv := s3test.Start(t)
	cl, err := cluster.NewClient(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := clustertest.InstallCRDs(cl); err != nil {
		t.Fatal(err)
	}
	clustertest.Namespace(t, cl, ns)
	opts := clustertest.NodeOptions{Namespace: ns, Env: srv.Env(),
		Args: []string{"--archive=" + srv.URL("cluster"), "--archive-endpoint=" + srv.Endpoint}}
	optsA := opts
	optsA.Name = "node-a"
	optsA.Args = append(slices.Clone(opts.Args), argsA...)
	nodeA := cp.StartNode(t, optsA)
	gw := cp.StartGateway(t, "gw", ns)
	key := nodeA.AdminKey(t)
	waitLive(t, cl, ns, 1)
	c, err := client.New(client.Config{URL: gw.URL, APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	return archivedCluster{cp: cp, srv: srv, cl: cl, opts: opts, nodeA: nodeA, key: key, c: c}
}

// create makes a sandbox of base through the gateway (on node A while it
// is the only node), killed when the test ends.
func (ac archivedCluster) create(ctx context.Context, t *testing.T) string {
	t.Helper()
	created, err := ac.c.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: new(int64(600))})
	if err != nil {
		t.Fatalf("create through the gateway: %v", err)
	}
	t.Cleanup(func() { _ = ac.c.Kill(context.Background(), created.SandboxID) })
	return created.SandboxID
}

// startNode starts another node archiving to the same store (args are
// more flags: a later flag overrides an earlier one).
func (ac archivedCluster) startNode(t *testing.T, name string, args ...string) *clustertest.Proc {
	t.Helper()
	o := ac.opts
	o.Name = name
	o.Args = append(slices.Clone(o.Args), args...)
	return ac.cp.StartNode(t, o)
}

// pause pauses sandbox id through the gateway and waits for its record to
// say it is paused into the archive on node.
func (ac archivedCluster) pause(ctx context.Context, t *testing.T, records *cluster.Records, id, node string) {
	t.Helper()
	if err := ac.c.Pause(ctx, id, true); err != nil {
		t.Fatalf("pause through the gateway: %v", err)
	}
	clustertest.Poll(t, time.Minute, "the record says archived on "+node, func(ctx context.Context) (bool, string) {
		rec, err := records.Sandbox(ctx, id)
		if err != nil {
			return false, err.Error()
		}
		return rec.Spec.Node == node && rec.Status.Phase == v1alpha1.SandboxPaused && rec.Status.Archived, fmt.Sprintf("%+v %+v", rec.Spec, rec.Status)
	})
}

// nodeHas says whether node n holds a copy of sandbox id — its API knows
// it or its data dir has it — and the state its API gives.
func nodeHas(ctx context.Context, t *testing.T, key string, n *clustertest.Proc, id string) (string, bool) {
	t.Helper()
	nc, err := client.New(client.Config{URL: n.URL, APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	// Its own deadline: a poll's last message describes what was, not
	// the poll's expiry.
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	d, err := nc.Get(gctx, id)
	if err == nil {
		return d.State, true
	}
	_, serr := os.Stat(filepath.Join(n.DataDir, "sandboxes", id))
	return fmt.Sprintf("GET: %v; data dir: %v", err, serr), !client.IsNotFound(err) || serr == nil
}

// holders describes what each node holds of sandbox id, for a failure.
func holders(ctx context.Context, t *testing.T, key string, nodes []*clustertest.Proc, id string) string {
	var parts []string
	for _, n := range nodes {
		state, ok := nodeHas(ctx, t, key, n, id)
		parts = append(parts, fmt.Sprintf("%s: held %v (%s)", n.Name, ok, state))
	}
	return strings.Join(parts, ", ")
}
