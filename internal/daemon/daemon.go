// Package daemon assembles a cella daemon: its Config, validated whole before
// anything starts (config.go), then store, admin key, runtime (probed),
// templates, sandbox manager and API handler, with every resource registered
// as a named closer and closed in reverse order. `cella serve` and the
// end-to-end tests build the same daemon through it.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/agentpin"
	"github.com/cella-sandbox/cella/internal/api"
	"github.com/cella-sandbox/cella/internal/audit"
	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/builds"
	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/events"
	"github.com/cella-sandbox/cella/internal/metrics"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/crun"
	"github.com/cella-sandbox/cella/internal/runtime/gvisor"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/secrets"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/volume"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Daemon is a running cella daemon without its listener.
type Daemon struct {
	Handler   http.Handler
	Manager   *sandbox.Manager
	Store     *store.Store
	Templates *template.Store
	Volumes   *volume.Manager
	Runtime   runtime.Runtime
	Secrets   *secrets.Manager
	Audit     *audit.Log
	// Builds is E2B's template build API's core.
	Builds *builds.Service
	// Ceiling is the operator's egress ceiling (empty: no egress).
	Ceiling   egress.Policy
	Reconcile sandbox.ReconcileReport
	// AdminKeyPath is where the admin key was written on first start.
	AdminKeyPath string
	// Metrics are the daemon's instruments (served at /metrics); template
	// builds report through ObservedBuilder (observe.go).
	Metrics *metrics.Metrics
	// Builder is the daemon's template build engine (BuildEngine, each
	// step in a sandbox of Manager, with the build egress policy) observed
	// in Metrics.
	Builder     build.Builder
	BuildEngine *build.Engine
	// Agents are the agent binaries on the host, Agent the hash of the one
	// new sandboxes boot with (Config.Agent).
	Agents *agentpin.Store
	Agent  string

	log     *slog.Logger
	closers []closer
	// cluster is the Kubernetes client of a cluster node (nil: standalone).
	cluster client.Client

	// servingPorts are the ports the API is served on (Serving): the egress
	// proxy never dials them on loopback, where a name an operator mapped
	// there would otherwise reach the daemon's own API.
	servingPorts sync.Map // uint16 → struct{}

	egressCounts api.EgressCounters
}

// Serving tells the daemon an address its Handler is served on.
func (d *Daemon) Serving(addr net.Addr) {
	if ta, ok := addr.(*net.TCPAddr); ok {
		d.servingPorts.Store(uint16(ta.Port), struct{}{})
	}
}

// selfUpstream is the egress proxy's DenyUpstream: the daemon's own API.
func (d *Daemon) selfUpstream(ap netip.AddrPort) (string, bool) {
	if _, ok := d.servingPorts.Load(ap.Port()); ok && ap.Addr().IsLoopback() {
		return "the cella daemon's own API", true
	}
	return "", false
}

// New builds and starts a daemon: on failure everything made so far is
// released again.
func New(ctx context.Context, c Config) (d *Daemon, err error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	log := c.Log
	// `return nil, err` clears d before deferred calls run: release what was
	// built through a variable of its own.
	built := &Daemon{log: log}
	d = built
	defer func() {
		if err != nil {
			built.Close()
		}
	}()
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	st, err := store.Open(filepath.Join(c.DataDir, "cella.db"))
	if err != nil {
		return nil, err
	}
	d.Store = st
	d.add("store", st.Close)
	var clusterKey string
	var keys apiKeys = st // a cluster node's keys are the cluster's (cluster.go)
	var gatewayKey []byte
	if c.Cluster.Kubeconfig != "" {
		if d.cluster, err = clusterClient(c.Cluster); err != nil {
			return nil, err
		}
		if clusterKey, keys, gatewayKey, err = clusterAuth(ctx, d.cluster, c.Cluster, st); err != nil {
			return nil, err
		}
	}
	if d.AdminKeyPath, err = ensureAdminKey(ctx, st, c.DataDir, clusterKey, log); err != nil {
		return nil, err
	}

	// Sandboxes run the agent binary they were booted with, kept by its
	// hash: a checkpoint restores with the agent it was saved with, even
	// after an upgrade brought another (agentpin).
	agents, err := agentpin.Open(c.DataDir)
	if err != nil {
		return nil, err
	}
	d.add("agent binaries", agents.Close)
	if d.Agent, err = agents.Add(c.Agent); err != nil {
		return nil, err
	}
	d.Agents = agents

	rt, err := newRuntime(c)
	if err != nil {
		return nil, err
	}
	d.Runtime = rt
	d.add("runtime", rt.Close)
	pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	took, err := rt.Probe(pctx, filepath.Join(c.DataDir, "probe"))
	cancel()
	if err != nil {
		return nil, fmt.Errorf("runtime %s does not work on this host, refusing to start: %w", rt.Name(), err)
	}
	log.Info("runtime probed", "runtime", rt.Name(), "run_true", took.Round(time.Millisecond))

	tpls, err := template.NewStore(c.CacheDir)
	if err != nil {
		return nil, err
	}
	d.Templates = tpls
	tpls.Registry, tpls.Layers.MaxLayerSize = c.Registry, c.MaxLayerSize
	// While this daemon runs no cella's GC removes its builtin recipes'
	// images (other versions sharing the cache have their own).
	releaseBuiltins, err := tpls.HoldBuiltins()
	if err != nil {
		return nil, err
	}
	d.add("builtin template hold", func() error { releaseBuiltins(); return nil })
	// Leftovers of pulls that crashed and leases of sandboxes that are gone.
	if res, err := tpls.GC(); err != nil {
		log.Warn("template cache garbage collection", "err", err)
	} else if len(res.Images)+len(res.Layers) > 0 {
		log.Info("template cache garbage collected", "images", res.Images, "layers", len(res.Layers))
	}
	box, err := secrets.OpenBox(c.DataDir)
	if err != nil {
		return nil, err
	}
	vols, err := volume.New(ctx, volume.Config{DataDir: c.DataDir, Store: st, Box: box, Log: log})
	if err != nil {
		return nil, err
	}
	d.Volumes = vols
	d.add("volumes", vols.Close)

	var secretRecs secrets.Records = st // a cluster node's are the cluster's (cluster.go)
	secretBox := box
	if d.cluster != nil {
		if secretRecs, secretBox, err = clusterSecrets(ctx, d.cluster, c.Cluster); err != nil {
			return nil, err
		}
	}
	sm, err := secrets.NewManager(ctx, secretRecs, secretBox)
	if err != nil {
		return nil, err
	}
	d.Secrets = sm
	if d.cluster != nil {
		stop := reloadSecrets(sm, log)
		d.add("cluster secrets", func() error { stop(); return nil })
	}
	al, err := audit.New(filepath.Join(c.DataDir, "audit"), audit.Options{Redact: sm.Redact, Log: log})
	if err != nil {
		return nil, err
	}
	d.Audit = al
	d.add("audit log", al.Close)

	var sbNet *sandbox.Network
	if !c.Network.Disabled {
		d.Ceiling = c.net.ceiling
		// Slots of sandboxes a crashed daemon left running are kept for
		// the manager's Reconcile to adopt (sandbox/network.go).
		adoptable, err := sandbox.RecordedNetSlots(ctx, st)
		if err != nil {
			return nil, fmt.Errorf("read recorded network slots: %w", err)
		}
		if d.cluster != nil {
			if err := clusterEgressCA(ctx, d.cluster, c, log); err != nil { // archive.go
				return nil, err
			}
		}
		n, closeNet, err := newNetwork(c, log, al, sm, d.selfUpstream, &d.egressCounts, adoptable)
		if err != nil {
			return nil, err
		}
		sbNet = n
		d.add("network", closeNet)
	}

	evCfg := events.Config{Store: st, Box: box, Audit: agentAudit{al}, Log: log, Allow: c.WebhookAllow}
	if d.cluster != nil { // every node delivers to the cluster's webhooks (cluster.go)
		evCfg.Webhooks, evCfg.Box = clusterWebhooks(d.cluster, c.Cluster), secretBox
	}
	evs, err := events.New(evCfg)
	if err != nil {
		return nil, err
	}
	d.add("events", evs.Close) // closed after the sandboxes: a shutdown's kills are still queued, not blocked

	d.Metrics = newMetrics(rt.Name(), tpls) // observe.go
	arch, err := d.openArchive(ctx, c)      // archive.go
	if err != nil {
		return nil, err
	}
	mgr, err := sandbox.NewManager(sandbox.Config{
		DataDir: c.DataDir, Runtime: rt, Templates: tpls, Store: st, Log: log,
		Agents: agents, Agent: d.Agent,
		BuildProgress: c.BuildProgress, Volumes: vols, Lifecycle: c.Lifecycle,
		AgentAudit: agentAudit{al}, Events: evs, Network: sbNet, SecretValue: sm.Get, MetricsInterval: c.MetricsInterval, Maxima: c.Maxima,
		PoolMemoryBudget: c.PoolMemoryBudget,
		Metrics:          d.Metrics, KeyLimits: keyLimits(keys),
		Archive: arch, Claim: d.claim(c.Cluster), NodeName: c.Cluster.NodeName,
		ClusterQuota: d.clusterQuota(c.Cluster), // cluster.go
	})
	if err != nil {
		return nil, err
	}
	d.Manager = mgr
	mx := mgr.Maxima()
	log.Info("sandbox maxima", "cpus", mx.CPUs, "memory_mib", mx.MemoryMB, "disk_mib", mx.DiskMB, "pids", mx.Pids)
	if d.cluster != nil { // closes after "sandboxes": the records then say what is left (paused ones)
		d.add("cluster records (last)", func() error { return lastRecords(d.cluster, c.Cluster, mgr) })
	}
	d.add("sandboxes", func() error {
		sctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		return mgr.Shutdown(sctx)
	})
	if d.Reconcile, err = mgr.Reconcile(ctx); err != nil {
		return nil, fmt.Errorf("reconcile after start: %w", err)
	}
	if err := mgr.StartPools(ctx, c.Pools); err != nil { // after Reconcile: pooled sandboxes have no record
		return nil, fmt.Errorf("warm pools: %w", err)
	}
	if c.Cluster.Kubeconfig != "" { // after Reconcile: the first beat counts the adopted sandboxes
		if err := d.joinCluster(ctx, c.Cluster, mgr, tpls, st); err != nil {
			return nil, err
		}
	}
	if d.BuildEngine, err = build.New(build.Config{Sandboxes: mgr, Templates: tpls, Egress: c.buildEgress(d.Ceiling),
		Timeout: c.Build.Timeout, ReadyTimeout: c.Build.ReadyTimeout, Log: log}); err != nil {
		return nil, err
	}
	d.Builder = ObservedBuilder(d.BuildEngine, d.Metrics)

	stopPrune := pruneAuditLogs(al, mgr, c.AuditRetention, log) // audit.go
	d.add("audit pruning", func() error { stopPrune(); return nil })
	accessLog, closeAccessLog, err := openAccessLog(c.AccessLog) // observe.go
	if err != nil {
		return nil, err
	}
	d.add("access log", closeAccessLog)
	builder := d.Builder
	if c.Builder != nil {
		builder = c.Builder
	}
	bsvc, err := builds.New(builds.Config{Store: st, Templates: tpls, Builder: builder, Starter: d.BuildEngine, Dir: filepath.Join(c.DataDir, "builds"), Log: log,
		Shared: d.shared(c.Cluster, tpls)}) // clustertemplates.go
	if err != nil {
		return nil, fmt.Errorf("template builds: %w", err)
	}
	d.Builds = bsvc
	d.add("template builds", func() error { bsvc.Close(); return nil })
	srv := api.New(api.Config{Manager: mgr, Pools: mgr, Store: keys, GatewayKey: gatewayKey, Templates: tpls, Domain: c.Domain, Log: log, MCPMaxCalls: c.MCPMaxCalls,
		Volumes: vols, Secrets: sm, Audit: al, EgressCeiling: ceilingPtr(c, d.Ceiling), Egress: &d.egressCounts,
		Metrics: d.Metrics, AccessLog: accessLog, Builds: bsvc, Events: evs})
	d.Handler = srv
	d.add("api", func() error { srv.Close(); return nil })
	return d, nil
}

// closer is one resource of the daemon, named for the log.
type closer struct {
	name  string
	close func() error
}

func (d *Daemon) add(name string, f func() error) {
	d.closers = append(d.closers, closer{name, f})
}

// Close stops every sandbox and releases everything, in reverse order of
// their making. A closer's failure is logged with its name and does not
// keep the others from closing; Close returns them all.
func (d *Daemon) Close() error {
	log := d.log
	if log == nil {
		log = slog.Default()
	}
	var errs []error
	for i := len(d.closers) - 1; i >= 0; i-- {
		c := d.closers[i]
		if err := c.close(); err != nil {
			log.Error("shutdown: closing failed", "closer", c.name, "err", err)
			errs = append(errs, fmt.Errorf("close %s: %w", c.name, err))
		}
	}
	d.closers = nil
	return errors.Join(errs...)
}

func newRuntime(c Config) (runtime.Runtime, error) {
	switch c.Runtime {
	case runtime.GVisor:
		return gvisor.New(gvisor.Config{RunscPath: c.RunscPath, RootDir: filepath.Join(c.DataDir, "runsc"), DebugLogDir: c.RunscDebugDir})
	case runtime.Namespaces:
		return crun.New(crun.Config{RootDir: filepath.Join(c.DataDir, "crun")})
	}
	return nil, fmt.Errorf("unknown runtime %q", c.Runtime)
}

// ensureAdminKey creates the admin API key on first start (preset: the
// cluster's, else a new one). Only its hash is stored; the key itself goes
// to <data-dir>/admin.key, readable by root only.
func ensureAdminKey(ctx context.Context, st *store.Store, dataDir, preset string, log *slog.Logger) (string, error) {
	path := filepath.Join(dataDir, "admin.key")
	n, err := st.CountAPIKeys(ctx)
	if err != nil {
		return "", err
	}
	if n > 0 {
		log.Info("admin API key", "file", path)
		return path, nil
	}
	key := preset
	if key == "" {
		if key, err = store.NewKeySecret(); err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write admin key: %w", err)
	}
	if err := st.AddAPIKey(ctx, store.AdminKeyID, "admin", key); err != nil {
		return "", err
	}
	log.Info("created the admin API key", "file", path)
	return path, nil
}

// logWriter turns template build progress lines into log records.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	for len(p) > 0 && (p[len(p)-1] == '\n' || p[len(p)-1] == '\r') {
		p = p[:len(p)-1]
	}
	w.log.Info("template build", "line", string(p))
	return len(p), nil
}

// ceilingPtr is the ceiling the API applies; nil when sandboxes get no
// network at all.
func ceilingPtr(c Config, p egress.Policy) *egress.Policy {
	if c.Network.Disabled {
		return nil
	}
	return &p
}
