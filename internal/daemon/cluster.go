package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/api"
	"github.com/cella-sandbox/cella/internal/builds"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/secrets"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ClusterConfig makes the daemon a node of a cella cluster whose state is
// in a Kubernetes API server (internal/cluster). Empty Kubeconfig: a
// standalone daemon.
type ClusterConfig struct {
	// Kubeconfig is a kubeconfig file, or cluster.InCluster.
	Kubeconfig string
	// Namespace holds the cluster's records and Leases.
	Namespace string
	// NodeName is this node's name in the cluster (its Lease).
	NodeName string
	// Endpoint is the URL other members (gateways) reach this daemon at.
	Endpoint string
	// LeaseDuration is how long one renewal keeps the node alive (0: 10 s).
	LeaseDuration time.Duration
	// TemplateRegistry is REGISTRY/PREFIX, where the node pushes the
	// templates it builds over the API and pulls the ones other nodes
	// built (clustertemplates.go); "": API builds stay on their node.
	TemplateRegistry string
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// validate checks a cluster membership's fields (none when standalone).
func (c ClusterConfig) validate() error {
	if c.Kubeconfig == "" {
		if c.NodeName != "" {
			return fieldErr("node-name", "%q: needs --cluster (a kubeconfig file or %s)", c.NodeName, cluster.InCluster)
		}
		if c.TemplateRegistry != "" {
			return fieldErr("template-registry", "%q: needs --cluster (a standalone daemon's templates are its own: cella template push)", c.TemplateRegistry)
		}
		return nil
	}
	if c.NodeName == "" {
		return fieldErr("node-name", "required with --cluster: this node's name in the cluster")
	}
	if err := cluster.ValidNodeName(c.NodeName); err != nil {
		return fieldErr("node-name", "%v", err)
	}
	if !dnsLabel.MatchString(c.Namespace) {
		return fieldErr("cluster-namespace", "%q: want a Kubernetes namespace name (a DNS label)", c.Namespace)
	}
	u, err := url.Parse(c.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "0.0.0.0" || u.Hostname() == "::" {
		return fieldErr("advertise-url", "%q: want the http(s)://HOST:PORT other members reach this daemon at (not an unspecified address)", c.Endpoint)
	}
	if c.LeaseDuration != 0 && (c.LeaseDuration < 3*time.Second || c.LeaseDuration > 10*time.Minute) {
		return fieldErr("lease-duration", "%v is out of range (3s to 10m)", c.LeaseDuration)
	}
	if r := c.TemplateRegistry; r != "" {
		host, prefix, _ := strings.Cut(r, "/")
		if host == "" || strings.Contains(r, "://") || strings.ContainsAny(prefix, ":@") || strings.HasSuffix(r, "/") || prefix != strings.ToLower(prefix) {
			return fieldErr("template-registry", "%q: want HOST[:PORT]/PREFIX, e.g. registry.example:5000/cella (lower-case, no scheme, tag or digest)", r)
		}
	}
	return nil
}

// clusterClient is the node's client of the cluster's API server.
func clusterClient(c ClusterConfig) (client.Client, error) {
	rc, err := cluster.RESTConfig(c.Kubeconfig)
	if err != nil {
		return nil, &FieldError{Field: "cluster", Err: err}
	}
	cl, err := cluster.NewClient(rc)
	if err != nil {
		return nil, &FieldError{Field: "cluster", Err: err}
	}
	return cl, nil
}

// apiKeys are the keys the API serves: the node's store, or on a cluster
// node the cluster's.
type apiKeys = api.Keys

// clusterKeys are a cluster node's keys: the cluster's, in a Kubernetes
// Secret, with the owners of gone sandboxes from the node's own store.
type clusterKeys struct {
	*cluster.Keys
	st *store.Store
}

func (k clusterKeys) SandboxOwner(ctx context.Context, id string) (team, key string, err error) {
	return k.st.SandboxOwner(ctx, id)
}

// clusterAuth is what a node authenticates with: the admin key every node
// of the cluster shares, the cluster's keys, and the key of the gateways'
// assertions (each made by the first node to join).
func clusterAuth(ctx context.Context, cl client.Client, c ClusterConfig, st *store.Store) (string, apiKeys, []byte, error) {
	kctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	admin, err := cluster.AdminKey(kctx, cl, c.Namespace, store.NewKeySecret)
	if err != nil {
		return "", nil, nil, fmt.Errorf("the cluster's admin key: %w", err)
	}
	gw, err := cluster.GatewayKey(kctx, cl, c.Namespace, true)
	if err != nil {
		return "", nil, nil, fmt.Errorf("the cluster's gateway key: %w", err)
	}
	return admin, clusterKeys{cluster.NewKeys(cl, c.Namespace), st}, gw, nil
}

// clusterSecrets are where a node keeps user secrets: the cluster's
// Secret, sealed under the cluster's master key, so every node injects the
// same ones.
func clusterSecrets(ctx context.Context, cl client.Client, c ClusterConfig) (secrets.Records, *secrets.Box, error) {
	kctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	key, err := cluster.MasterKey(kctx, cl, c.Namespace)
	if err != nil {
		return nil, nil, fmt.Errorf("the cluster's master key: %w", err)
	}
	box, err := secrets.NewBox(key)
	if err != nil {
		return nil, nil, fmt.Errorf("the cluster's master key: %w", err)
	}
	return cluster.NewSecretRecords(cl, c.Namespace), box, nil
}

// clusterWebhooks are the cluster's webhooks: each node delivers its own
// sandboxes' events to every team webhook registered through any node or
// gateway. Their signing secrets are sealed under the cluster's master key
// (clusterSecrets' box), which every node opens.
func clusterWebhooks(cl client.Client, c ClusterConfig) *cluster.WebhookRecords {
	return cluster.NewWebhookRecords(cl, c.Namespace)
}

// secretsReload is how often a node reads the cluster's secrets again: a
// secret set through any node is injected by every node within it.
const secretsReload = time.Second

// reloadSecrets keeps sm in step with the cluster's secrets until the
// returned func is called.
func reloadSecrets(sm *secrets.Manager, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(secretsReload)
		defer t.Stop()
		failing := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			err := sm.Reload(ctx)
			if err != nil && !failing && ctx.Err() == nil {
				log.Warn("cluster: reading the cluster's secrets failed", "err", err)
			}
			failing = err != nil
		}
	}()
	return func() { cancel(); <-done }
}

// joinCluster takes the node's Lease and keeps renewing it, with the
// capacity counted from the manager and the template store.
func (d *Daemon) joinCluster(ctx context.Context, c ClusterConfig, mgr *sandbox.Manager, tpls *template.Store, st *store.Store) error {
	cl := d.cluster
	jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n, err := cluster.Join(jctx, cluster.NodeConfig{
		Client: cl, Namespace: c.Namespace, Name: c.NodeName, Endpoint: c.Endpoint,
		Inventory: inventory{mgr, tpls, st}, Duration: c.LeaseDuration, Log: d.log,
	})
	if err != nil {
		return fmt.Errorf("join the cluster as node %s: %w", c.NodeName, err)
	}
	d.log.Info("cluster: joined", "node", c.NodeName, "namespace", c.Namespace, "endpoint", c.Endpoint, "identity", n.Identity())
	d.add("cluster lease", n.Close)
	stop := recordSandboxes(cluster.NewRecords(cl, c.Namespace), c.NodeName, mgr, d.log)
	d.add("cluster records", func() error { stop(); return nil })
	return nil
}

// recordInterval is how often a node brings its Sandbox records up to date.
const recordInterval = time.Second

// aliasSweepInterval is how often a node drops the template alias
// reservations that stand for nothing (cluster.SweepAliases); a claimant
// of such an alias takes it over anyway.
const aliasSweepInterval = 5 * time.Minute

// recordSandboxes keeps the node's Sandbox records in step with its
// manager until the returned func is called (which waits for the pass in
// flight).
func recordSandboxes(r *cluster.Records, node string, mgr *sandbox.Manager, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(recordInterval)
		defer t.Stop()
		var failing bool
		var swept time.Time
		for {
			if time.Since(swept) >= aliasSweepInterval {
				// What a node that died between an alias's reservation and
				// its template's record (or deletion) left behind.
				swept = time.Now()
				if err := r.SweepAliases(ctx); err != nil && ctx.Err() == nil {
					log.Warn("cluster: sweeping stale template alias reservations failed", "err", err)
				}
			}
			// Copies other nodes took go first: recorded again, a stale
			// copy whose record its new holder deleted would be this
			// node's once more.
			err := forgetMoved(ctx, r, node, mgr, log)
			err = errors.Join(err, r.SyncNode(ctx, node, observe(mgr)))
			if err != nil && !failing && ctx.Err() == nil {
				log.Warn("cluster: recording sandboxes failed", "node", node, "err", err)
			}
			failing = err != nil
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

// forgetMoved drops this node's copies of archived sandboxes whose record
// another node holds now (it resumed them from the archive), or whose
// record and objects are both gone (another node took it and killed it,
// or resumed and then killed it, before this node saw the record move):
// such a copy can never resume, and recorded again it would be a sandbox
// nobody kills.
func forgetMoved(ctx context.Context, r *cluster.Records, node string, mgr *sandbox.Manager, log *slog.Logger) error {
	var errs []error
	for _, id := range mgr.Archived() {
		holder, err := r.Holder(ctx, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if holder == node {
			continue
		}
		if holder == "" {
			gone, err := mgr.ArchiveGone(ctx, id)
			if err != nil {
				errs = append(errs, err)
			}
			if !gone {
				continue // not synced yet, or its record was lost: it is still this node's
			}
			holder = "(none: its record and objects are gone)"
		}
		log.Info("cluster: an archived sandbox was taken by another node", "id", id, "holder", holder)
		if err := mgr.Forget(ctx, id); err != nil && !errdefs.Is(err, errdefs.KindNotFound) && !errdefs.Is(err, errdefs.KindConflict) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// lastRecords brings the node's records up to date once more as the
// daemon stops, after its running sandboxes stopped: their records go, the
// paused ones (kept for the next daemon on this data dir) stay.
func lastRecords(cl client.Client, c ClusterConfig, mgr *sandbox.Manager) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return cluster.NewRecords(cl, c.Namespace).SyncNode(ctx, c.NodeName, observe(mgr))
}

// observe lists the node's running and paused sandboxes for their records
// (a dead one gets none: it serves nothing and its node reports why).
func observe(mgr *sandbox.Manager) []cluster.Observed {
	var out []cluster.Observed
	for _, sb := range mgr.List(tenant.System) {
		in := sb.Info()
		var phase v1alpha1.SandboxPhase
		switch in.State {
		case sandbox.StateRunning:
			phase = v1alpha1.SandboxRunning
		case sandbox.StatePaused:
			phase = v1alpha1.SandboxPaused
		default:
			continue
		}
		o := in.Options.Owner()
		out = append(out, cluster.Observed{ID: in.ID, Team: o.Team, KeyID: o.Key, Template: in.TemplateID,
			Phase: phase, StartedAt: in.StartedAt, EndAt: in.EndAt, AutoPause: in.Options.AutoPause, Archived: in.Lifecycle.Archived})
	}
	return out
}

// inventory counts what a node publishes in its Lease.
type inventory struct {
	mgr  *sandbox.Manager
	tpls *template.Store
	// st has the API templates this node built or pulled.
	st *store.Store
}

func (i inventory) Sandboxes() int { return len(i.mgr.List(tenant.System)) }

func (i inventory) Templates() []string {
	ts, err := i.tpls.List()
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(ts))
	for _, t := range ts {
		if !builds.IsStoreName(t.Name) { // the template store may be shared by nodes on one host
			names = append(names, t.Name)
		}
	}
	// The API templates by ID and alias, as creates name them, when this
	// node has a ready build of one (no pull).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	apis, err := i.st.ListAPITemplates(ctx)
	if err != nil {
		return names
	}
	for _, t := range apis {
		bs, err := i.st.ListBuilds(ctx, t.ID)
		if err == nil && slices.ContainsFunc(bs, func(b store.Build) bool { return b.Status == builds.StatusReady }) {
			names = append(names, t.ID, t.Alias)
		}
	}
	return names
}

// clusterQuota is where a node holds key quotas across the cluster (nil
// when standalone: the manager's own count is the whole).
func (d *Daemon) clusterQuota(c ClusterConfig) sandbox.ClusterQuota {
	if d.cluster == nil {
		return nil
	}
	return cluster.NewKeyUsages(d.cluster, c.Namespace, c.NodeName)
}

// shared is the node's builds.Shared (nil when standalone).
func (d *Daemon) shared(c ClusterConfig, tpls *template.Store) builds.Shared {
	if d.cluster == nil {
		return nil
	}
	return &sharedTemplates{records: cluster.NewRecords(d.cluster, c.Namespace), tpls: tpls, node: c.NodeName, registry: c.TemplateRegistry, log: d.log}
}
