package clustertest

import (
	"context"
	"fmt"
	"io/fs"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/deploy/kubernetes/crds"
	"github.com/cella-sandbox/cella/internal/cluster"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// InstallCRDs creates cella's CRDs exactly as deploy/kubernetes/crds has
// them and waits until the API server serves each (Established).
func InstallCRDs(c client.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	files, err := fs.Glob(crds.FS, "*.yaml")
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no CRDs embedded: %v", err)
	}
	var names []string
	for _, f := range files {
		b, err := crds.FS.ReadFile(f)
		if err != nil {
			return err
		}
		j, err := yaml.YAMLToJSON(b)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(j); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if err := c.Create(ctx, u); err != nil {
			return fmt.Errorf("create CRD %s: %w", f, err)
		}
		names = append(names, u.GetName())
	}
	for _, n := range names {
		for {
			u := &unstructured.Unstructured{}
			u.SetAPIVersion("apiextensions.k8s.io/v1")
			u.SetKind("CustomResourceDefinition")
			if err := c.Get(ctx, types.NamespacedName{Name: n}, u); err != nil {
				return fmt.Errorf("read CRD %s: %w", n, err)
			}
			if established(u) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("CRD %s not Established: %w", n, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

func established(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// Namespace creates namespace name (for the test's records and Leases).
func Namespace(t testing.TB, c client.Client, name string) {
	t.Helper()
	ns := &unstructured.Unstructured{}
	ns.SetAPIVersion("v1")
	ns.SetKind("Namespace")
	ns.SetName(name)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Create(ctx, ns); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}

// StartIn is Start, with a client of the control plane, cella's CRDs
// installed and namespace ns made: what a test of cella's cluster starts
// with.
func StartIn(t testing.TB, ns string) (*ControlPlane, client.Client) {
	t.Helper()
	cp := Start(t)
	cl, err := cluster.NewClient(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := InstallCRDs(cl); err != nil {
		t.Fatal(err)
	}
	Namespace(t, cl, ns)
	return cp, cl
}

// WaitLive polls until exactly want nodes of namespace ns are live with
// their capacity published.
func WaitLive(t testing.TB, c client.Client, ns string, want int) {
	t.Helper()
	Poll(t, 2*time.Minute, fmt.Sprintf("%d nodes live", want), func(ctx context.Context) (bool, string) {
		nodes, err := cluster.Nodes(ctx, c, ns)
		live := 0
		for _, n := range nodes {
			if n.Live && n.Capacity.MemoryTotalBytes > 0 {
				live++
			}
		}
		return err == nil && live == want, fmt.Sprint(nodes, err)
	})
}
