package cluster_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/quota"
	"github.com/cella-sandbox/cella/internal/store"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestRBAC: deploy/kubernetes/{namespace,rbac}.yaml pass a server-side dry
// run and apply; a node acting with the cella-node ServiceAccount's token
// can do all a node does (join, record its sandboxes, the admin key) and a
// gateway with cella-gateway's all a gateway does (read nodes and records,
// mark a dead node's sandboxes lost) — and neither more: no other Secret,
// no creates for the gateway.
func TestRBAC(t *testing.T) {
	clustertest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := filepath.Join(daemontest.RepoRoot(t), "deploy", "kubernetes")
	// The namespace first: a dry run creates nothing, so the objects in it
	// would find no namespace.
	for _, f := range []string{"namespace.yaml", "rbac.yaml"} {
		path := filepath.Join(dir, f)
		if out, err := cp.Kubectl(ctx, t, nil, "apply", "--dry-run=server", "-f", path); err != nil {
			t.Fatalf("kubectl apply --dry-run=server -f %s: %v\n%s", f, err, out)
		}
		if out, err := cp.Kubectl(ctx, t, nil, "apply", "-f", path); err != nil {
			t.Fatalf("kubectl apply -f %s: %v\n%s", f, err, out)
		}
	}
	const ns = cluster.DefaultNamespace
	as := func(sa string) client.Client {
		out, err := cp.Kubectl(ctx, t, nil, "-n", ns, "create", "token", sa)
		if err != nil {
			t.Fatalf("kubectl create token %s: %v\n%s", sa, err, out)
		}
		rc := cp.RESTConfig()
		rc.BearerToken = strings.TrimSpace(out)
		c, err := cluster.NewClient(rc)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	node, gw := as("cella-node"), as("cella-gateway")

	// Another Secret in the namespace, which neither role may read.
	other := &corev1.Secret{}
	other.Namespace, other.Name = ns, "unrelated"
	other.StringData = map[string]string{"x": "y"}
	if err := cpCl.Create(ctx, other); err != nil {
		t.Fatal(err)
	}

	n, err := cluster.Join(ctx, cluster.NodeConfig{Client: node, Namespace: ns, Name: "rbac-node", Endpoint: "http://127.0.0.1:1", Duration: 3 * time.Second})
	if err != nil {
		t.Fatalf("join as cella-node: %v", err)
	}
	defer n.Close()
	key, err := cluster.AdminKey(ctx, node, ns, func() (string, error) { return "k-1", nil })
	if err != nil || key != "k-1" {
		t.Fatalf("admin key as cella-node: %q %v", key, err)
	}
	if key, err = cluster.AdminKey(ctx, node, ns, func() (string, error) { return "k-2", nil }); err != nil || key != "k-1" {
		t.Fatalf("admin key again: %q %v (want the first node's k-1)", key, err)
	}
	gwKey, err := cluster.GatewayKey(ctx, node, ns, true)
	if err != nil || len(gwKey) < 32 {
		t.Fatalf("gateway key as cella-node: %q %v", gwKey, err)
	}
	archiveKey, err := cluster.ArchiveKey(ctx, node, ns)
	if err != nil || len(archiveKey) != 32 {
		t.Fatalf("archive key as cella-node: %v", err)
	}
	if again, err := cluster.ArchiveKey(ctx, node, ns); err != nil || string(again) != string(archiveKey) {
		t.Fatalf("archive key again as cella-node: %v (want the first one)", err)
	}
	ca, err := cluster.EgressCA(ctx, node, ns, func() (string, error) { return "ca-1", nil })
	if err != nil || ca != "ca-1" {
		t.Fatalf("egress CA as cella-node: %q %v", ca, err)
	}
	alice, aliceKey, err := cluster.NewKeys(node, ns).CreateAPIKey(ctx, store.NewKey{Name: "alice", Team: "alpha"})
	if err != nil {
		t.Fatalf("create an API key as cella-node: %v", err)
	}
	if mk, err := cluster.MasterKey(ctx, node, ns); err != nil || len(mk) != 32 {
		t.Fatalf("master key as cella-node: %d bytes, %v", len(mk), err)
	}
	sr := cluster.NewSecretRecords(node, ns)
	if err := sr.CreateSecret(ctx, store.Secret{ID: "sec_1", Name: "S", Ciphertext: []byte("sealed"), Version: 1}); err != nil {
		t.Fatalf("store a secret as cella-node: %v", err)
	}
	if err := sr.CreateSecret(ctx, store.Secret{ID: "sec_2", Name: "S"}); !errors.Is(err, store.ErrSecretExists) {
		t.Errorf("a secret's name taken twice: %v", err)
	}
	if err := cluster.NewSecretRecords(gw, ns).DeleteSecret(ctx, "sec_1"); !errdefs.Is(err, errdefs.KindForbidden) {
		t.Errorf("cella-gateway deleted a user secret: %v", err)
	}
	recs := cluster.NewRecords(node, ns)
	obs := []cluster.Observed{{ID: "rbac1", Team: "t", Template: "base", Phase: v1alpha1.SandboxRunning}}
	if err := recs.SyncNode(ctx, "rbac-node", obs); err != nil {
		t.Fatalf("record sandboxes as cella-node: %v", err)
	}
	if err := recs.Claim(ctx, "rbac1", "rbac-node"); err != nil {
		t.Fatalf("claim its own sandbox as cella-node: %v", err)
	}
	if err := node.Get(ctx, types.NamespacedName{Namespace: ns, Name: "unrelated"}, &corev1.Secret{}); !errdefs.Is(cluster.KindOf(err), errdefs.KindForbidden) {
		t.Errorf("cella-node read another Secret: %v", err)
	}
	// A node records the templates it builds; a gateway reads them and
	// removes one, never writes one.
	for _, digest := range []string{"", "sha256:" + strings.Repeat("cd", 32)} {
		if _, err := recs.EditTemplate(ctx, "rbactpl", func(tp *v1alpha1.Template) error {
			tp.Spec.Team, tp.Spec.Node, tp.Spec.Digest = "t", "rbac-node", digest
			if digest != "" {
				tp.Spec.Reference = "registry.test/cella/rbactpl:b1"
			}
			return nil
		}); err != nil {
			t.Fatalf("record a template as cella-node (digest %q): %v", digest, err)
		}
	}
	gwRecs := cluster.NewRecords(gw, ns)
	if _, err := gwRecs.EditTemplate(ctx, "rbactpl2", func(*v1alpha1.Template) error { return nil }); !errdefs.Is(err, errdefs.KindForbidden) {
		t.Errorf("cella-gateway created a template record: %v", err)
	}
	if tp, err := gwRecs.FindTemplate(ctx, "rbactpl", "", func(*v1alpha1.Template) bool { return true }); err != nil {
		t.Errorf("read a template as cella-gateway: %v", err)
	} else if err := gwRecs.DeleteTemplate(ctx, tp); err != nil {
		t.Errorf("delete a template as cella-gateway: %v", err)
	}

	// A node reserves the aliases of what it builds and writes what keys
	// hold on it; a gateway does neither (it only releases the aliases of
	// a template it deletes).
	if id, err := recs.ReserveAlias(ctx, "rbac-alias", "t", "rbactpl"); err != nil || id != "rbactpl" {
		t.Errorf("reserve an alias as cella-node: %q %v", id, err)
	}
	if _, err := gwRecs.ReserveAlias(ctx, "rbac-alias-2", "t", "rbactpl"); !errdefs.Is(err, errdefs.KindForbidden) {
		t.Errorf("cella-gateway reserved an alias: %v", err)
	}
	if err := cluster.NewKeyUsages(node, ns, "rbac-node").Hold(ctx, "key-1", quota.Usage{Sandboxes: 1}, nil); err != nil {
		t.Errorf("record a key's usage as cella-node: %v", err)
	}
	if err := cluster.NewKeyUsages(gw, ns, "rbac-gw").Hold(ctx, "key-1", quota.Usage{}, nil); !errdefs.Is(err, errdefs.KindForbidden) {
		t.Errorf("cella-gateway wrote a key's usage: %v", err)
	}

	nodes, err := cluster.Nodes(ctx, gw, ns)
	if err != nil || len(nodes) != 1 || !nodes[0].Live {
		t.Fatalf("nodes as cella-gateway: %+v %v", nodes, err)
	}
	lost, err := cluster.NewRecords(gw, ns).MarkLost(ctx, "rbac-node", "test")
	if err != nil || len(lost) != 1 {
		t.Fatalf("mark lost as cella-gateway: %v %v", lost, err)
	}
	if err := cluster.NewRecords(gw, ns).CreateSandbox(ctx, &v1alpha1.Sandbox{}); !errdefs.Is(err, errdefs.KindForbidden) {
		t.Errorf("cella-gateway created a sandbox record: %v", err)
	}
	if k, err := cluster.NewKeys(gw, ns).LookupAPIKey(ctx, aliceKey); err != nil || k.ID != alice.ID || k.TeamID != "alpha" {
		t.Errorf("authenticate a key as cella-gateway: %+v %v", k, err)
	}
	if k, err := cluster.GatewayKey(ctx, gw, ns, false); err != nil || string(k) != string(gwKey) {
		t.Errorf("gateway key as cella-gateway: %v", err)
	}
	if _, _, err := cluster.NewKeys(gw, ns).CreateAPIKey(ctx, store.NewKey{Name: "mallory"}); !errdefs.Is(err, errdefs.KindForbidden) {
		t.Errorf("cella-gateway created an API key: %v", err)
	}
	for _, name := range []string{cluster.AdminKeySecret, cluster.ArchiveKeySecret, cluster.EgressCASecret, "unrelated"} {
		if err := gw.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &corev1.Secret{}); !errdefs.Is(cluster.KindOf(err), errdefs.KindForbidden) {
			t.Errorf("cella-gateway read Secret %s: %v", name, err)
		}
	}
	// Volume records are the gateways' (they place and route volumes);
	// webhooks are the nodes' (each delivers its sandboxes' events).
	vr := cluster.NewVolumeRecords(gw, ns)
	vol, err := vr.Reserve(ctx, v1alpha1.VolumeSpec{Team: "alpha", Name: "data", Node: "rbac-node"})
	if err != nil {
		t.Fatalf("reserve a volume as cella-gateway: %v", err)
	}
	if _, err := vr.Reserve(ctx, v1alpha1.VolumeSpec{Team: "alpha", Name: "data", Node: "other"}); !errdefs.Is(err, errdefs.KindConflict) {
		t.Errorf("a team's volume name reserved twice: %v", err)
	}
	if err := vr.Complete(ctx, vol, "vol_1"); err != nil {
		t.Fatalf("complete a volume record as cella-gateway: %v", err)
	}
	if got, err := vr.ByID(ctx, "vol_1"); err != nil || got.Spec.Node != "rbac-node" {
		t.Errorf("volume by ID: %+v %v", got, err)
	}
	if err := vr.Delete(ctx, vol); err != nil {
		t.Errorf("delete a volume record as cella-gateway: %v", err)
	}
	if _, err := cluster.NewVolumeRecords(node, ns).Reserve(ctx, v1alpha1.VolumeSpec{Team: "t", Name: "x", Node: "n"}); !errdefs.Is(err, errdefs.KindForbidden) {
		t.Errorf("cella-node wrote a volume record: %v", err)
	}
	wr := cluster.NewWebhookRecords(node, ns)
	if err := wr.PutWebhook(ctx, store.Webhook{ID: "wh_1", TeamID: "alpha", URL: "http://127.0.0.1:1/"}); err != nil {
		t.Fatalf("store a webhook as cella-node: %v", err)
	}
	if hs, err := wr.ListWebhooks(ctx, "beta"); err != nil || len(hs) != 0 {
		t.Errorf("another team's webhooks: %+v %v", hs, err)
	}
	if err := wr.DeleteWebhook(ctx, "beta", "wh_1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("another team deleted a webhook: %v", err)
	}
	if err := wr.DeleteWebhook(ctx, "alpha", "wh_1"); err != nil {
		t.Errorf("delete a webhook as cella-node: %v", err)
	}
	if _, err := cluster.NewWebhookRecords(gw, ns).ListWebhooks(ctx, ""); !errdefs.Is(err, errdefs.KindForbidden) {
		t.Errorf("cella-gateway read the webhooks: %v", err)
	}

	// The node brings its record back from Lost: the node's truth wins.
	if err := recs.SyncNode(ctx, "rbac-node", obs); err != nil {
		t.Fatal(err)
	}
	if sb, err := recs.Sandbox(ctx, "rbac1"); err != nil || sb.Status.Phase != v1alpha1.SandboxRunning {
		t.Fatalf("after the node's sync: %+v %v", sb, err)
	}
	if err := recs.SyncNode(ctx, "rbac-node", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := recs.Sandbox(ctx, "rbac1"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("a sandbox the node no longer holds keeps its record: %v", err)
	}
}
