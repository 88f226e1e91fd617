package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/clustertest"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestClusterSecrets: a secret set through the gateway is the cluster's —
// both nodes list it within their reload; the Kubernetes Secret holding it
// has its value only sealed; an update and a delete through the gateway
// reach both nodes too.
func TestClusterSecrets(t *testing.T) {
	const ns = "cella-secrets"
	cp, cl := clustertest.StartIn(t, ns)
	nodeA := cp.StartNode(t, clustertest.NodeOptions{Name: "node-a", Namespace: ns})
	nodeB := cp.StartNode(t, clustertest.NodeOptions{Name: "node-b", Namespace: ns})
	gw := cp.StartGateway(t, "gw-1", ns)
	clustertest.WaitLive(t, cl, ns, 2)
	admin := nodeA.AdminKey(t)
	const value = "cluster-secret-value-8f3a"
	if code, body := call(t, "POST", gw.URL+"/secrets", admin, `{"name":"SHARED_TOKEN","value":"`+value+`"}`); code/100 != 2 {
		t.Fatalf("POST /secrets through the gateway: %d %s", code, body)
	}
	lists := func(want string, present bool) {
		t.Helper()
		for _, n := range []*clustertest.Proc{nodeA, nodeB} {
			clustertest.Poll(t, time.Minute, fmt.Sprintf("%s lists %s=%v", n.Name, want, present), func(ctx context.Context) (bool, string) {
				code, body := get(t, n.URL+"/secrets", admin)
				return code == http.StatusOK && strings.Contains(body, want) == present, fmt.Sprintf("%d %s", code, body)
			})
		}
	}
	lists(`"SHARED_TOKEN"`, true)
	s := &corev1.Secret{}
	if err := cl.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: cluster.SecretsSecret}, s); err != nil {
		t.Fatal(err)
	}
	for k, v := range s.Data {
		if strings.Contains(string(v), value) {
			t.Fatalf("the Secret %s holds %s's value in the clear", cluster.SecretsSecret, k)
		}
	}
	if code, body := call(t, "POST", gw.URL+"/secrets/SHARED_TOKEN", admin, `{"value":"another-value-1234","metadata":{"rev":"two"}}`); code/100 != 2 {
		t.Fatalf("update through the gateway: %d %s", code, body)
	}
	lists(`"two"`, true)
	if code, body := call(t, "DELETE", gw.URL+"/secrets/SHARED_TOKEN", admin, ""); code/100 != 2 {
		t.Fatalf("delete through the gateway: %d %s", code, body)
	}
	lists(`"SHARED_TOKEN"`, false)
}
