package gateway_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/errdefs"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestGatewayRecordLag: a sandbox its node has not recorded yet is reached
// through the gateway all the same, never a 404. The API server refuses
// every Sandbox record create in the namespace (a ResourceQuota of zero),
// so the record of a sandbox made on node-a directly never appears — the
// lag of a node's record writes (a second, more while they fail or wait),
// made to last. Through the gateway its GET, an exec (sandbox traffic), and
// after a pause on its node a connect (resumed there) and a kill all reach
// it on node-a; another team's key still gets 404 for it, and an ID no node
// holds is a 404 as before. Before holder.go each of the first was a 404
// (sandbox traffic: E2B's edge 502): TestNodeDrain's connect to a sandbox
// made on node-a, paused by the drain, failed so once.
func TestGatewayRecordLag(t *testing.T) {
	const ns = "cella-gwlag"
	cp, cl := clustertest.StartIn(t, ns)
	nodeA := cp.StartNode(t, clustertest.NodeOptions{Name: "node-a", Namespace: ns})
	cp.StartNode(t, clustertest.NodeOptions{Name: "node-b", Namespace: ns})
	gw := cp.StartGateway(t, "gw-1", ns)
	clustertest.WaitLive(t, cl, ns, 2)
	admin := nodeA.AdminKey(t)
	bob := newKey(t, gw.URL, admin, "bob", "beta")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const counted = corev1.ResourceName("count/sandboxes.cella.dev")
	q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "no-sandbox-records", Namespace: ns},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{counted: resource.MustParse("0")}}}
	if err := cl.Create(ctx, q); err != nil {
		t.Fatal(err)
	}
	// No quota controller runs here: the status the quota admission
	// checks against is written by hand.
	q.Status = corev1.ResourceQuotaStatus{Hard: q.Spec.Hard, Used: corev1.ResourceList{counted: resource.MustParse("0")}}
	if err := cl.Status().Update(ctx, q); err != nil {
		t.Fatal(err)
	}
	records := cluster.NewRecords(cl, ns)
	clustertest.Poll(t, time.Minute, "the API server refuses Sandbox records", func(ctx context.Context) (bool, string) {
		probe := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "quotaprobe"},
			Spec: v1alpha1.SandboxSpec{Team: "probe", Template: "base", Node: "nowhere"}}
		err := records.CreateSandbox(ctx, probe)
		if err == nil {
			_ = records.DeleteSandbox(ctx, probe)
			return false, "a record was still created"
		}
		return errdefs.Is(err, errdefs.KindForbidden), err.Error()
	})

	a, err := client.New(client.Config{URL: nodeA.URL, APIKey: admin})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := a.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: new(int64(300))})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.SandboxID
	t.Cleanup(func() { _ = a.Kill(context.Background(), id) })
	noRecord := func(when string) {
		t.Helper()
		if _, err := records.Sandbox(ctx, id); !errdefs.Is(err, errdefs.KindNotFound) {
			t.Fatalf("%s, the sandbox has a record (%v): the test no longer shows a gateway without one", when, err)
		}
	}
	noRecord("made on node-a")

	g, err := client.New(client.Config{URL: gw.URL, APIKey: admin})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := g.Get(ctx, id); err != nil || d.State != "running" {
		t.Fatalf("GET through the gateway of a sandbox without a record: %+v %v", d, err)
	}
	if code, body := call(t, "GET", gw.URL+"/sandboxes/"+id, bob, ""); code != http.StatusNotFound {
		t.Errorf("another team's key reads it through the gateway: %d %s, want 404", code, body)
	}
	if code, body := call(t, "GET", gw.URL+"/sandboxes/nosuchsandbox0000000", admin, ""); code != http.StatusNotFound {
		t.Errorf("a sandbox no node holds through the gateway: %d %s, want 404", code, body)
	}
	conn, err := g.Sandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := conn.Exec(ctx, "echo hello from $(hostname)", client.ExecOptions{}); err != nil || res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "hello from ") {
		t.Fatalf("exec through the gateway in a sandbox without a record: %+v %v", res, err)
	}

	if err := a.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	if _, resumed, err := g.ConnectResumed(ctx, id); err != nil || !resumed {
		t.Fatalf("connect through the gateway to a paused sandbox without a record: resumed=%v %v", resumed, err)
	}
	if d, err := a.Get(ctx, id); err != nil || d.State != "running" {
		t.Errorf("after the connect, on node-a: %+v %v, want running", d, err)
	}
	if err := g.Kill(ctx, id); err != nil {
		t.Fatalf("kill through the gateway of a sandbox without a record: %v", err)
	}
	if _, err := a.Get(ctx, id); !client.IsNotFound(err) {
		t.Errorf("after the kill through the gateway, node-a still has it: %v", err)
	}
	noRecord("after the requests through the gateway")
}
