package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/clusterdeps"
	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/errdefs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// One control plane for the package: starting one costs seconds of a
// shared CPU; each test works in a namespace of its own.
var (
	cp   *clustertest.ControlPlane
	cpCl client.Client
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if clusterdeps.Enabled() {
		bins, err := clusterdeps.Lookup()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if cp, err = clustertest.New(bins); err != nil {
			fmt.Fprintln(os.Stderr, "start the control plane:", err)
			return 1
		}
		defer func() {
			fmt.Fprintf(os.Stderr, "control plane CPU time: %s\n", cp.CPUTime())
			cp.Stop()
		}()
		fmt.Fprintf(os.Stderr, "control plane up: etcd %v, kube-apiserver %v; CPU so far: %s\n", cp.EtcdReady.Round(time.Millisecond), cp.Ready.Round(time.Millisecond), cp.CPUTime())
		if cpCl, err = cluster.NewClient(cp.RESTConfig()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := clustertest.InstallCRDs(cpCl); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

// env is the shared control plane and a fresh namespace named after the
// test.
func env(t *testing.T) (client.Client, string) {
	t.Helper()
	clustertest.Require(t)
	ns := strings.Trim(strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())), "-")
	if len(ns) > 50 {
		ns = ns[:50]
	}
	clustertest.Namespace(t, cpCl, ns)
	return cpCl, ns
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func sandbox(id, node string) *v1alpha1.Sandbox {
	end := metav1.NewTime(time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC))
	start := metav1.NewTime(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))
	return &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: id},
		Spec: v1alpha1.SandboxSpec{
			Team: "team-a", KeyID: "key-1", Template: "base", Node: node,
			Lifecycle: v1alpha1.SandboxLifecycle{EndAt: &end, AutoPause: true, AutoStop: "15m", AutoArchive: "1h", AutoDelete: "7d"},
		},
		Status: v1alpha1.SandboxStatus{Phase: v1alpha1.SandboxRunning, Message: "started", StartedAt: &start, Archived: true},
	}
}

// TestCRDRoundTrip holds the CRD YAML to the Go types: every field of a
// fully set Sandbox and Template comes back as written (the API server
// prunes a field its schema lacks), and the schema's checks refuse bad
// records.
func TestCRDRoundTrip(t *testing.T) {
	c, ns := env(t)
	ctx := ctxT(t)
	r := cluster.NewRecords(c, ns)
	want := sandbox("abc123", "node-a")
	if err := r.CreateSandbox(ctx, want.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	got, err := r.Sandbox(ctx, "abc123")
	if err != nil {
		t.Fatal(err)
	}
	// Times come back in the local zone (metav1.Time): compare instants.
	if !got.Spec.Lifecycle.EndAt.Equal(want.Spec.Lifecycle.EndAt) {
		t.Errorf("endAt came back as %v, want %v", got.Spec.Lifecycle.EndAt, want.Spec.Lifecycle.EndAt)
	}
	gotSpec, wantSpec := got.Spec, want.Spec
	gotSpec.Lifecycle.EndAt, wantSpec.Lifecycle.EndAt = nil, nil
	if !reflect.DeepEqual(gotSpec, wantSpec) {
		t.Errorf("spec came back as\n%+v\nwant\n%+v", gotSpec, wantSpec)
	}
	if got.Status.Phase != want.Status.Phase || got.Status.Message != want.Status.Message || got.Status.Archived != want.Status.Archived || !got.Status.StartedAt.Equal(want.Status.StartedAt) {
		t.Errorf("status came back as %+v, want %+v", got.Status, want.Status)
	}
	if got.Labels[cluster.LabelNode] != "node-a" {
		t.Errorf("labels %v: want %s=node-a", got.Labels, cluster.LabelNode)
	}

	tpl := &v1alpha1.Template{ObjectMeta: metav1.ObjectMeta{Name: "tpl1"}, Spec: v1alpha1.TemplateSpec{
		Team: "team-a", Aliases: []string{"py", "python"},
		TemplateBuild: v1alpha1.TemplateBuild{Reference: "registry.test/cella/py:1", Digest: "sha256:" + strings.Repeat("ab", 32),
			Build: "b1", CPUCount: 2, MemoryMB: 1024, Services: []string{"code-interpreter"}},
		Tags: []v1alpha1.TemplateTag{{Tag: "v2", TemplateBuild: v1alpha1.TemplateBuild{Reference: "registry.test/cella/py:0",
			Digest: "sha256:" + strings.Repeat("cd", 32), Build: "b0", CPUCount: 1, MemoryMB: 512, Services: []string{"docker"}}}},
		Node: "node-a", Public: true,
	}}
	if err := r.PutTemplate(ctx, tpl.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	gotT, err := r.Template(ctx, "tpl1")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotT.Spec, tpl.Spec) {
		t.Errorf("template spec came back as %+v, want %+v", gotT.Spec, tpl.Spec)
	}

	for name, bad := range map[string]client.Object{
		"bad digest": &v1alpha1.Template{ObjectMeta: metav1.ObjectMeta{Name: "tpl2"}, Spec: v1alpha1.TemplateSpec{TemplateBuild: v1alpha1.TemplateBuild{Reference: "r", Digest: "md5:00"}}},
		"bad tag digest": &v1alpha1.Template{ObjectMeta: metav1.ObjectMeta{Name: "tpl3"}, Spec: v1alpha1.TemplateSpec{
			Tags: []v1alpha1.TemplateTag{{Tag: "v2", TemplateBuild: v1alpha1.TemplateBuild{Reference: "r", Digest: "md5:00"}}}}},
		"no node":      &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "nonode"}, Spec: v1alpha1.SandboxSpec{Team: "t", Template: "base"}},
		"bad id chars": sandbox("Bad_ID", "node-a"),
	} {
		var err error
		switch o := bad.(type) {
		case *v1alpha1.Template:
			err = r.PutTemplate(ctx, o)
		case *v1alpha1.Sandbox:
			err = r.CreateSandbox(ctx, o)
		}
		if !errdefs.Is(err, errdefs.KindInvalidArgument) {
			t.Errorf("%s: got %v, want an invalid-argument refusal from the schema", name, err)
		}
	}
}

// TestUpdateConflict: two writers read the same record; the second one's
// update carries a stale resourceVersion and is refused, not applied.
func TestUpdateConflict(t *testing.T) {
	c, ns := env(t)
	ctx := ctxT(t)
	r := cluster.NewRecords(c, ns)
	if err := r.CreateSandbox(ctx, sandbox("conf1", "node-a")); err != nil {
		t.Fatal(err)
	}
	a, err := r.Sandbox(ctx, "conf1")
	if err != nil {
		t.Fatal(err)
	}
	b := a.DeepCopy()
	a.Status.Phase = v1alpha1.SandboxPaused
	if err := r.UpdateSandboxStatus(ctx, a); err != nil {
		t.Fatal(err)
	}
	b.Status.Phase = v1alpha1.SandboxLost
	if err := r.UpdateSandboxStatus(ctx, b); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("stale update: got %v, want a conflict", err)
	}
	if err := r.DeleteSandbox(ctx, b); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("stale delete: got %v, want a conflict", err)
	}
	now, err := r.Sandbox(ctx, "conf1")
	if err != nil {
		t.Fatal(err)
	}
	if now.Status.Phase != v1alpha1.SandboxPaused {
		t.Fatalf("phase %s: the stale write landed", now.Status.Phase)
	}
	if err := r.CreateSandbox(ctx, sandbox("conf1", "node-b")); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("second create of one ID: got %v, want a conflict", err)
	}
	if err := r.DeleteSandbox(ctx, now); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Sandbox(ctx, "conf1"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("after delete: got %v, want not found", err)
	}
}

// TestMarkLost marks only the lost node's sandboxes, each with the reason.
func TestMarkLost(t *testing.T) {
	c, ns := env(t)
	ctx := ctxT(t)
	r := cluster.NewRecords(c, ns)
	for _, s := range []*v1alpha1.Sandbox{sandbox("a1", "node-a"), sandbox("a2", "node-a"), sandbox("b1", "node-b")} {
		if err := r.CreateSandbox(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	lost, err := r.MarkLost(ctx, "node-a", "node node-a: lease lapsed")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(lost, ",") != "a1,a2" {
		t.Fatalf("marked %v, want [a1 a2]", lost)
	}
	for id, want := range map[string]v1alpha1.SandboxPhase{"a1": v1alpha1.SandboxLost, "a2": v1alpha1.SandboxLost, "b1": v1alpha1.SandboxRunning} {
		sb, err := r.Sandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if sb.Status.Phase != want {
			t.Errorf("%s: phase %s, want %s", id, sb.Status.Phase, want)
		}
		if want == v1alpha1.SandboxLost && sb.Status.Message != "node node-a: lease lapsed" {
			t.Errorf("%s: message %q", id, sb.Status.Message)
		}
	}
}

type inventory struct{ n int }

func (i inventory) Sandboxes() int      { return i.n }
func (i inventory) Templates() []string { return []string{"base"} }

// TestNodeLease: nodes join with their capacity, a second process with a
// live node's name is refused, Close removes only the node's own Lease,
// and a node that stops renewing lapses and its name can be taken again.
func TestNodeLease(t *testing.T) {
	c, ns := env(t)
	ctx := ctxT(t)
	join := func(name string, n int) (*cluster.Node, error) {
		node, err := cluster.Join(ctx, cluster.NodeConfig{Client: c, Namespace: ns, Name: name,
			Endpoint: "http://127.0.0.1:1/" + name, Inventory: inventory{n}, Duration: 3 * time.Second})
		if err == nil {
			t.Cleanup(func() { node.Close() }) // a failing test stops renewing too
		}
		return node, err
	}
	a, err := join("node-a", 2)
	if err != nil {
		t.Fatal(err)
	}
	b, err := join("node-b", 5)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := cluster.Nodes(ctx, c, ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 2 || nodes[0].Name != "node-a" || nodes[1].Name != "node-b" {
		t.Fatalf("nodes %+v", nodes)
	}
	for i, want := range []int{2, 5} {
		n := nodes[i]
		if !n.Live || n.CapacityErr != "" || n.Capacity.Sandboxes != want || n.Capacity.MemoryFreeBytes == 0 ||
			n.Capacity.MemoryTotalBytes < n.Capacity.MemoryFreeBytes || n.Capacity.CPUs < 1 || !reflect.DeepEqual(n.Capacity.Templates, []string{"base"}) {
			t.Errorf("node %+v", n)
		}
		if n.Endpoint != "http://127.0.0.1:1/"+n.Name {
			t.Errorf("endpoint %q", n.Endpoint)
		}
	}

	if _, err := join("node-a", 0); !errdefs.Is(err, errdefs.KindConflict) || !strings.Contains(err.Error(), "--node-name") {
		t.Fatalf("second process as node-a: got %v, want a conflict naming --node-name", err)
	}
	if err := cluster.ValidNodeName("Node_A"); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Fatalf("bad name: got %v", err)
	}

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	nodes, _ = cluster.Nodes(ctx, c, ns)
	if len(nodes) != 1 || nodes[0].Name != "node-a" {
		t.Fatalf("after node-b left: %+v", nodes)
	}

	// node-a dies without a word: its Lease stays but lapses.
	a.Halt()
	for {
		nodes, err = cluster.Nodes(ctx, c, ns)
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) == 1 && !nodes[0].Live {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("node-a's lease never lapsed: %+v", nodes)
		}
		time.Sleep(100 * time.Millisecond)
	}
	a2, err := join("node-a", 0)
	if err != nil {
		t.Fatalf("take over a lapsed lease: %v", err)
	}
	nodes, _ = cluster.Nodes(ctx, c, ns)
	if len(nodes) != 1 || !nodes[0].Live || nodes[0].Holder != a2.Identity() {
		t.Fatalf("after take-over: %+v (want holder %s)", nodes, a2.Identity())
	}
}

// TestClaim: a node restoring a sandbox from the archive takes its record
// only from a node whose Lease lapsed (spec.node and the label move, the
// phase is Paused with where it came from); a live holder keeps it, so of
// two nodes racing for one archive exactly one wins; the holder's own
// claim and a sandbox without a record are no-ops.
func TestClaim(t *testing.T) {
	c, ns := env(t)
	ctx := ctxT(t)
	r := cluster.NewRecords(c, ns)
	if err := r.Claim(ctx, "norecord", "node-b"); err != nil {
		t.Fatalf("claim without a record: %v", err)
	}
	// node-a's Lease: live, then lapsed.
	a, err := cluster.Join(ctx, cluster.NodeConfig{Client: c, Namespace: ns, Name: "node-a", Endpoint: "http://127.0.0.1:1", Duration: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sb := sandbox("moving1", "node-a")
	sb.Status.Phase, sb.Status.Archived = v1alpha1.SandboxPaused, true
	if err := r.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := r.Claim(ctx, "moving1", "node-a"); err != nil {
		t.Fatalf("the holder's own claim: %v", err)
	}
	var held *cluster.HeldError
	if err := r.Claim(ctx, "moving1", "node-b"); !errors.As(err, &held) || held.Node != "node-a" {
		t.Fatalf("claim from a live holder: %v, want HeldError", err)
	}
	a.Halt() // as a kill -9 leaves it
	deadline := time.Now().Add(time.Minute)
	for {
		nodes, err := cluster.Nodes(ctx, c, ns)
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) == 1 && !nodes[0].Live {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-a's lease does not lapse: %+v", nodes)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// node-b and node-c race; node-b is live, node-c is not a member yet.
	b, err := cluster.Join(ctx, cluster.NodeConfig{Client: c, Namespace: ns, Name: "node-b", Endpoint: "http://127.0.0.1:2", Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cc, err := cluster.Join(ctx, cluster.NodeConfig{Client: c, Namespace: ns, Name: "node-c", Endpoint: "http://127.0.0.1:3", Duration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	errs := make(chan error, 2)
	for _, n := range []string{"node-b", "node-c"} {
		go func() { errs <- r.Claim(ctx, "moving1", n) }()
	}
	var won, lost int
	for range 2 {
		err := <-errs
		switch {
		case err == nil:
			won++
		case errors.As(err, &held):
			lost++
		default:
			t.Fatalf("claim: %v", err)
		}
	}
	if won != 1 || lost != 1 {
		t.Fatalf("two nodes racing: %d won, %d refused; want one each", won, lost)
	}
	got, err := r.Sandbox(ctx, "moving1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Node != held.Node {
		t.Fatalf("the record is on %q, the refused claim named %q as its holder", got.Spec.Node, held.Node)
	}
	if got.Labels[cluster.LabelNode] != got.Spec.Node || got.Status.Phase != v1alpha1.SandboxPaused || !strings.Contains(got.Status.Message, "moved from node node-a") || !got.Status.Archived {
		t.Fatalf("moved record: labels %v, status %+v", got.Labels, got.Status)
	}
	if list, err := r.Sandboxes(ctx, got.Spec.Node); err != nil || len(list) != 1 {
		t.Fatalf("the new holder's label-selected list: %v, %v", list, err)
	}
	// The holder drained (cella node drain): it no longer resumes it
	// itself, and another live node takes it.
	winner, other := got.Spec.Node, map[string]string{"node-b": "node-c", "node-c": "node-b"}[got.Spec.Node]
	if err := cluster.SetDrain(ctx, c, ns, winner, true); err != nil {
		t.Fatal(err)
	}
	if err := r.Claim(ctx, "moving1", winner); !errdefs.Is(err, errdefs.KindUnavailable) {
		t.Fatalf("a drained holder's own claim: %v, want unavailable", err)
	}
	if err := r.Claim(ctx, "moving1", other); err != nil {
		t.Fatalf("claim from a drained holder: %v", err)
	}
	if got, err := r.Sandbox(ctx, "moving1"); err != nil || got.Spec.Node != other {
		t.Fatalf("after the claim from a drained holder: %+v, %v", got, err)
	}
}
