package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A node's Lease is cella-node-<name> in the cluster namespace. Besides
// liveness (holderIdentity, renewTime, leaseDurationSeconds) it carries
// the node's endpoint and capacity as annotations, written in the same
// update as each renewal: one write per beat, and capacity is exactly as
// fresh as liveness (a separate status object would be two writes that can
// disagree). Placement reads every node with one LIST of Leases.
const (
	LeasePrefix = "cella-node-"
	// LabelRole=RoleNode marks the Leases of cella nodes.
	LabelRole = "cella.dev/role"
	RoleNode  = "node"
	// AnnotationEndpoint is the URL of the node's API and sandbox proxy.
	AnnotationEndpoint = "cella.dev/endpoint"
	// AnnotationCapacity is the node's Capacity as JSON.
	AnnotationCapacity = "cella.dev/capacity"
)

// Capacity is what a node has room for, as it last measured.
type Capacity struct {
	MemoryTotalBytes uint64 `json:"memoryTotalBytes"`
	// MemoryFreeBytes is MemAvailable: free plus reclaimable.
	MemoryFreeBytes uint64 `json:"memoryFreeBytes"`
	CPUs            int    `json:"cpus"`
	// CPUIdle is the fraction of all CPUs idle since the previous beat.
	CPUIdle float64 `json:"cpuIdle"`
	// Sandboxes is how many sandboxes the node holds (running or paused).
	Sandboxes int `json:"sandboxes"`
	// Templates are the template names present on the node.
	Templates []string `json:"templates"`
}

// Inventory is what a node counts of itself for its Capacity.
type Inventory interface {
	Sandboxes() int
	Templates() []string
}

// NodeConfig is one node's membership in the cluster.
type NodeConfig struct {
	Client    client.Client
	Namespace string
	// Name is the node's name (--node-name): a DNS label, unique in the
	// cluster.
	Name string
	// Endpoint is the URL other members reach the node's API at.
	Endpoint string
	// Inventory counts the node's sandboxes and templates.
	Inventory Inventory
	// Duration is how long a renewal keeps the node alive (default 10 s);
	// the node renews every third of it.
	Duration time.Duration
	Log      *slog.Logger
}

var nodeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$`)

// ValidNodeName checks a --node-name: it becomes part of a Lease name and
// a label value.
func ValidNodeName(name string) error {
	if !nodeName.MatchString(name) {
		return errdefs.InvalidArgument("node name %q: want 1-42 characters of a-z, 0-9 and '-', starting and ending alphanumeric", name)
	}
	return nil
}

// Node is a running membership: the Lease renewed until Close.
type Node struct {
	cfg      NodeConfig
	identity string
	cpu      cpuSampler

	cancel context.CancelFunc
	done   chan struct{}

	mu sync.Mutex
	// lastErr is the last renewal's failure (nil once one succeeds).
	lastErr error
}

// Join takes the node's Lease (refused while another live process holds
// it: two daemons with one node name would each think sandboxes theirs)
// and renews it in the background until Close.
func Join(ctx context.Context, cfg NodeConfig) (*Node, error) {
	if err := ValidNodeName(cfg.Name); err != nil {
		return nil, err
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	host, _ := os.Hostname()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	n := &Node{cfg: cfg, identity: fmt.Sprintf("%s/%s/%d/%s", cfg.Name, host, os.Getpid(), hex.EncodeToString(suffix)), done: make(chan struct{})}
	n.cpu.sample() // the first beat's idle fraction is since now
	if err := n.renew(ctx); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go n.loop(rctx)
	return n, nil
}

// Identity is the holderIdentity this process writes.
func (n *Node) Identity() string { return n.identity }

// LeaseName is the name of node name's Lease.
func LeaseName(name string) string { return LeasePrefix + name }

func (n *Node) loop(ctx context.Context) {
	defer close(n.done)
	t := time.NewTicker(n.cfg.Duration / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, n.cfg.Duration/3)
		err := n.renew(rctx)
		cancel()
		n.mu.Lock()
		if err != nil && n.lastErr == nil {
			n.cfg.Log.Warn("cluster: lease renewal failed", "node", n.cfg.Name, "err", err)
		}
		n.lastErr = err
		n.mu.Unlock()
	}
}

// renew creates or renews the Lease with the node's capacity, checked
// against the resourceVersion just read: a concurrent writer (another
// process claiming the name) makes it fail rather than be overwritten.
func (n *Node) renew(ctx context.Context) error {
	capa, err := n.capacity()
	if err != nil {
		return err
	}
	capJSON, err := json.Marshal(capa)
	if err != nil {
		return err
	}
	now := metav1.NowMicro()
	secs := int32(n.cfg.Duration / time.Second)
	key := types.NamespacedName{Namespace: n.cfg.Namespace, Name: LeaseName(n.cfg.Name)}
	l := &coordinationv1.Lease{}
	err = n.cfg.Client.Get(ctx, key, l)
	if errdefs.Is(kindOf(err, ""), errdefs.KindNotFound) {
		l = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: map[string]string{LabelRole: RoleNode, LabelNode: n.cfg.Name}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &n.identity, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
		}
		l.Annotations = map[string]string{AnnotationEndpoint: n.cfg.Endpoint, AnnotationCapacity: string(capJSON)}
		return kindOf(n.cfg.Client.Create(ctx, l), "create lease %s", key.Name)
	}
	if err != nil {
		return kindOf(err, "read lease %s", key.Name)
	}
	if h := l.Spec.HolderIdentity; h != nil && *h != n.identity && leaseLive(l, time.Now()) {
		return errdefs.Conflict("node name %s: lease %s/%s is %s by %s (renewed %s ago); give this daemon another --node-name",
			n.cfg.Name, key.Namespace, key.Name, errNotOurs, *h, time.Since(l.Spec.RenewTime.Time).Round(time.Second))
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != n.identity {
		l.Spec.HolderIdentity = &n.identity
		l.Spec.AcquireTime = &now
		trans := int32(0)
		if l.Spec.LeaseTransitions != nil {
			trans = *l.Spec.LeaseTransitions
		}
		trans++
		l.Spec.LeaseTransitions = &trans
	}
	l.Spec.RenewTime = &now
	l.Spec.LeaseDurationSeconds = &secs
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[LabelRole], l.Labels[LabelNode] = RoleNode, n.cfg.Name
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	// Other annotations (an operator's drain mark) are kept as read.
	l.Annotations[AnnotationEndpoint] = n.cfg.Endpoint
	l.Annotations[AnnotationCapacity] = string(capJSON)
	return kindOf(n.cfg.Client.Update(ctx, l), "renew lease %s", key.Name)
}

func (n *Node) capacity() (Capacity, error) {
	c, err := hostCapacity()
	if err != nil {
		return c, err
	}
	c.CPUIdle = n.cpu.sample()
	if n.cfg.Inventory != nil {
		c.Sandboxes = n.cfg.Inventory.Sandboxes()
		c.Templates = n.cfg.Inventory.Templates()
	}
	return c, nil
}

// halt stops the renewals and waits for the last one to end.
func (n *Node) halt() {
	n.cancel()
	<-n.done
}

// Err is the last renewal's failure, nil when the Lease is current.
func (n *Node) Err() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lastErr
}

// Close stops renewing and deletes the Lease if it is still this
// process's (so the node leaves at once instead of after its duration).
func (n *Node) Close() error {
	n.halt()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l := &coordinationv1.Lease{}
	key := types.NamespacedName{Namespace: n.cfg.Namespace, Name: LeaseName(n.cfg.Name)}
	if err := n.cfg.Client.Get(ctx, key, l); err != nil {
		if errdefs.Is(kindOf(err, ""), errdefs.KindNotFound) {
			return nil
		}
		return kindOf(err, "read lease %s", key.Name)
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != n.identity {
		return nil
	}
	rv, uid := l.ResourceVersion, l.UID
	if err := n.cfg.Client.Delete(ctx, l, client.Preconditions{ResourceVersion: &rv, UID: &uid}); err != nil {
		return kindOf(err, "delete lease %s", key.Name)
	}
	return nil
}
