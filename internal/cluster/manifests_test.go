package cluster_test

import (
	"bytes"
	"context"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/deploy/kubernetes/crds"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// TestManifests: deploy/kubernetes as Kustomize passes `kubectl apply
// --dry-run=server -k` against the real API server (the namespace made
// first: a dry run creates nothing) and then a real apply; and what it
// builds holds together — the node DaemonSet privileged, with the node's
// ServiceAccount, joining in-cluster under the Kubernetes node's name and
// advertising its pod IP, on host paths for its data; the gateway with
// two replicas, its own ServiceAccount, no privilege; the Service
// selecting exactly the gateway pods; both reading the ConfigMap; and
// every ServiceAccount a pod names is one rbac.yaml binds.
func TestManifests(t *testing.T) {
	clustertest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := filepath.Join(daemontest.RepoRoot(t), "deploy", "kubernetes")
	if out, err := cp.Kubectl(ctx, t, nil, "apply", "-f", filepath.Join(dir, "namespace.yaml")); err != nil {
		t.Fatalf("kubectl apply -f namespace.yaml: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"apply", "--dry-run=server", "-k", dir}, {"apply", "-k", dir}} {
		if out, err := cp.Kubectl(ctx, t, nil, args...); err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	built, err := cp.Kubectl(ctx, t, nil, "kustomize", dir)
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, built)
	}

	var ds appsv1.DaemonSet
	var dep appsv1.Deployment
	var svc corev1.Service
	var cm corev1.ConfigMap
	bound := map[string]bool{}
	kinds := map[string]int{}
	for _, doc := range bytes.Split([]byte(built), []byte("\n---\n")) {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		kinds[meta.Kind]++
		var into any
		switch meta.Kind {
		case "DaemonSet":
			into = &ds
		case "Deployment":
			into = &dep
		case "Service":
			into = &svc
		case "ConfigMap":
			into = &cm
		case "RoleBinding":
			var rb rbacv1.RoleBinding
			if err := yaml.Unmarshal(doc, &rb); err != nil {
				t.Fatal(err)
			}
			for _, s := range rb.Subjects {
				bound[s.Name] = true
			}
			continue
		default:
			continue
		}
		if err := yaml.UnmarshalStrict(doc, into); err != nil {
			t.Fatalf("%s: %v", meta.Kind, err)
		}
	}
	for _, k := range []string{"Namespace", "CustomResourceDefinition", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "DaemonSet", "Deployment", "Service"} {
		if kinds[k] == 0 {
			t.Errorf("the kustomization builds no %s", k)
		}
	}
	// Every CRD of deploy/kubernetes/crds is deployed (sandboxes,
	// templates, volumes).
	if files, _ := fs.Glob(crds.FS, "*.yaml"); kinds["CustomResourceDefinition"] != len(files) || len(files) < 3 {
		t.Errorf("%d CRDs, want the %d of deploy/kubernetes/crds", kinds["CustomResourceDefinition"], len(files))
	}

	node := ds.Spec.Template.Spec
	if len(node.Containers) != 1 || node.Containers[0].SecurityContext == nil || node.Containers[0].SecurityContext.Privileged == nil || !*node.Containers[0].SecurityContext.Privileged {
		t.Errorf("the node container is not privileged (gVisor needs it): %+v", node.Containers)
	}
	nc := node.Containers[0]
	env := map[string]corev1.EnvVar{}
	for _, e := range nc.Env {
		env[e.Name] = e
	}
	if e := env["CELLA_NODE_NAME"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("CELLA_NODE_NAME is not the Kubernetes node's name: %+v", e)
	}
	if e := env["CELLA_ADVERTISE_URL"]; !strings.Contains(e.Value, "$(POD_IP)") {
		t.Errorf("CELLA_ADVERTISE_URL does not advertise the pod IP: %+v", e)
	}
	if cm.Data["CELLA_CLUSTER"] != cluster.InCluster || cm.Data["CELLA_CLUSTER_NAMESPACE"] != cluster.DefaultNamespace {
		t.Errorf("config: %+v", cm.Data)
	}
	for _, spec := range []corev1.PodSpec{node, dep.Spec.Template.Spec} {
		c := spec.Containers[0]
		if len(c.EnvFrom) == 0 || c.EnvFrom[0].ConfigMapRef == nil || c.EnvFrom[0].ConfigMapRef.Name != cm.Name {
			t.Errorf("%s does not read the ConfigMap %s", c.Args, cm.Name)
		}
		if !bound[spec.ServiceAccountName] {
			t.Errorf("pods run as ServiceAccount %q, which no RoleBinding binds", spec.ServiceAccountName)
		}
		if c.Image != "ghcr.io/cella-sandbox/cella:latest" {
			t.Errorf("image %q: the kustomization's images entry did not apply", c.Image)
		}
	}
	if node.ServiceAccountName != "cella-node" || dep.Spec.Template.Spec.ServiceAccountName != "cella-gateway" {
		t.Errorf("service accounts: node %q, gateway %q", node.ServiceAccountName, dep.Spec.Template.Spec.ServiceAccountName)
	}
	mounts := map[string]bool{}
	for _, m := range nc.VolumeMounts {
		mounts[m.MountPath] = true
	}
	for _, p := range []string{"/var/lib/cella", "/var/cache/cella"} {
		if !mounts[p] {
			t.Errorf("the node does not mount %s from the host", p)
		}
	}
	if !slices.Equal(nc.Args, []string{"serve"}) || !slices.Equal(dep.Spec.Template.Spec.Containers[0].Args, []string{"gateway"}) {
		t.Errorf("args: node %v, gateway %v", nc.Args, dep.Spec.Template.Spec.Containers[0].Args)
	}
	gc := dep.Spec.Template.Spec.Containers[0]
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
		t.Errorf("the gateway has %v replicas, want 2 or more (one can die mid-request)", dep.Spec.Replicas)
	}
	if gc.SecurityContext == nil || gc.SecurityContext.Privileged != nil && *gc.SecurityContext.Privileged || gc.SecurityContext.RunAsNonRoot == nil || !*gc.SecurityContext.RunAsNonRoot {
		t.Errorf("the gateway runs with privilege: %+v", gc.SecurityContext)
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	if !sel.Matches(labels.Set(dep.Spec.Template.Labels)) || sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("the Service %v selects the wrong pods (gateway %v, node %v)", svc.Spec.Selector, dep.Spec.Template.Labels, ds.Spec.Template.Labels)
	}
	// What the apply made is there.
	for _, kind := range []string{"daemonset/cella-node", "deployment/cella-gateway", "service/cella-gateway", "configmap/cella-config", "role/cella-operator"} {
		if out, err := cp.Kubectl(ctx, t, nil, "-n", cluster.DefaultNamespace, "get", kind); err != nil {
			t.Errorf("kubectl get %s after the apply: %v\n%s", kind, err, out)
		}
	}
}
