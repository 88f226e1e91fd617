// Package cluster is cella's state in the Kubernetes API: the client (from
// a kubeconfig or in-cluster), the Sandbox and Template records
// (cella.dev/v1alpha1, written with resourceVersion-checked updates), and
// node liveness — each `cella serve --cluster` renews a
// coordination.k8s.io/v1 Lease that also carries its capacity. The node's
// SQLite stays the node's own detail; this package holds what the cluster
// shares. It knows nothing of HTTP routes or of sandboxes' internals.
package cluster

import (
	"errors"
	"fmt"

	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/errdefs"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// InCluster is the --cluster value that reads the pod's service account.
const InCluster = "in-cluster"

// DefaultNamespace holds cella's resources unless told otherwise.
const DefaultNamespace = "cella-system"

// Scheme knows cella's types and the Kubernetes types cella uses.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{v1alpha1.AddToScheme, coordinationv1.AddToScheme, corev1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// RESTConfig reads where the API server is: a kubeconfig file, InCluster
// for the pod's service account, or "" for kubectl's default ($KUBECONFIG,
// then ~/.kube/config).
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == InCluster {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config: %w", err)
		}
		return c, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules() // "": $KUBECONFIG, then ~/.kube/config
	rules.ExplicitPath = kubeconfig
	c, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	return c, nil
}

// Client-side rate limit of a node's and a gateway's API client when the
// config sets none. client-go's own default (5 requests a second, bursts
// of 10) would bound the whole cluster's create rate by one gateway's
// client: a create writes several records. The API server's priority and
// fairness is what protects it; these are kube-scheduler's defaults.
const (
	DefaultQPS   = 50
	DefaultBurst = 100
)

// NewClient is a controller-runtime client of the API server at c with
// Scheme's types.
func NewClient(c *rest.Config) (client.Client, error) {
	s, err := Scheme()
	if err != nil {
		return nil, err
	}
	if c.QPS == 0 && c.RateLimiter == nil {
		c = rest.CopyConfig(c)
		c.QPS, c.Burst = DefaultQPS, DefaultBurst
	}
	cl, err := client.New(c, client.Options{Scheme: s})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return cl, nil
}

// Connect is NewClient of RESTConfig(kubeconfig): a client of the cluster
// named as --cluster names it.
func Connect(kubeconfig string) (client.Client, error) {
	rc, err := RESTConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	return NewClient(rc)
}

// kindOf turns an API server error into cella's kinds (mapped to HTTP once,
// in api): a stale resourceVersion is a conflict, a missing object not
// found; the rest keep the API server's message.
func kindOf(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	msg := fmt.Sprintf(format, args...)
	var k errdefs.Kind
	switch {
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err):
		k = errdefs.KindConflict
	case apierrors.IsNotFound(err):
		k = errdefs.KindNotFound
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		k = errdefs.KindInvalidArgument
	case apierrors.IsForbidden(err):
		k = errdefs.KindForbidden
	case apierrors.IsUnauthorized(err):
		k = errdefs.KindUnauthenticated
	case apierrors.IsServerTimeout(err), apierrors.IsServiceUnavailable(err), apierrors.IsTooManyRequests(err), apierrors.IsTimeout(err):
		k = errdefs.KindUnavailable
	default:
		return fmt.Errorf("%s: %w", msg, err)
	}
	return &errdefs.Error{Kind: k, Msg: msg + ": " + err.Error(), Err: err}
}

// errNotOurs is a Lease held by another process.
var errNotOurs = errors.New("held by another process")
