package api

import (
	"context"
	"encoding/json"
	"time"

	"github.com/cella-sandbox/cella/internal/audit"
	"github.com/cella-sandbox/cella/internal/edge"
	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/quota"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/secrets"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
	"github.com/cella-sandbox/cella/internal/volume"
)

// The API depends on these narrow interfaces of the core, not on its
// concrete types, so that its own logic — routing, auth, parsing, error
// shapes — is tested without root and without a daemon (the *_unit_test.go
// files, with small fakes); the daemon passes the real types, which the
// assertions below hold to them.

// Sandboxes is what the API uses of the sandbox core: the lifecycle of one
// sandbox as a principal may see it, its snapshots and forks, its metrics,
// and the traffic router the edge proxy reaches sandboxes through.
type Sandboxes interface {
	Create(ctx context.Context, p tenant.Principal, opts sandbox.Options) (*sandbox.Sandbox, error)
	Lookup(p tenant.Principal, id string) (*sandbox.Sandbox, error)
	List(p tenant.Principal) []*sandbox.Sandbox
	Kill(ctx context.Context, p tenant.Principal, id string) error
	SetTimeout(ctx context.Context, p tenant.Principal, id string, d time.Duration) error
	Extend(ctx context.Context, p tenant.Principal, id string, d time.Duration) (*sandbox.Sandbox, error)
	Connect(ctx context.Context, p tenant.Principal, id string, d time.Duration, keepMemory bool) (sb *sandbox.Sandbox, resumed bool, err error)
	Pause(ctx context.Context, p tenant.Principal, id string, keepMemory bool) error
	SetNetwork(ctx context.Context, caller tenant.Principal, id string, p *egress.Policy, network json.RawMessage, allowInternet *bool) error
	LifecycleDefaults() sandbox.Lifecycle

	// Owner is the owner of a sandbox the daemon still tracks; Tracked
	// whether it does (an ended sandbox's audit log outlives it).
	Owner(ctx context.Context, id string) (tenant.Owner, error)
	Tracked(id string) bool
	// VolumeUsers lists the live sandboxes mounting a volume.
	VolumeUsers(volumeID string) []string

	Snapshot(ctx context.Context, p tenant.Principal, id, name string) (sandbox.SnapshotInfo, error)
	ListSnapshots(ctx context.Context, p tenant.Principal, f sandbox.SnapshotFilter) ([]sandbox.SnapshotInfo, error)
	DeleteSnapshot(ctx context.Context, p tenant.Principal, idOrName string) error
	IsSnapshot(ctx context.Context, p tenant.Principal, idOrName string) bool
	SnapshotOrigin(sb *sandbox.Sandbox) (snapshotID string, memoryRestored bool)
	Fork(ctx context.Context, p tenant.Principal, id string, count int, timeout time.Duration) ([]sandbox.ForkResult, error)

	Metrics(p tenant.Principal, id string, start, end time.Time, fresh bool) ([]sandbox.Metric, error)
	LatestMetric(p tenant.Principal, id string) (mt sandbox.Metric, ok bool, err error)

	TrafficRouter() edge.Router
	// Maxima are the daemon's per-sandbox ceilings (overview.go).
	Maxima() sandbox.Maxima
	// RuntimeName labels the daemon's metrics.
	RuntimeName() string
	// Usage is what a key holds now against its quota (quotas.go).
	Usage(key string) (sandboxes int, cpus float64, memMB int64)
}

// Pools is what the API uses of the warm pools (sandbox.Manager).
type Pools interface {
	Pools() []sandbox.PoolStatus
	SetPool(ctx context.Context, name string, size int) (sandbox.PoolStatus, error)
}

// Keys is what the API uses of the store: API keys, and the recorded owner
// of a sandbox the daemon no longer tracks (whose audit log outlives it).
type Keys interface {
	LookupAPIKey(ctx context.Context, key string) (store.APIKey, error)
	CreateAPIKey(ctx context.Context, nk store.NewKey) (store.APIKey, string, error)
	ListAPIKeys(ctx context.Context) ([]store.APIKey, error)
	DeleteAPIKey(ctx context.Context, id string) error
	SandboxOwner(ctx context.Context, id string) (team, key string, err error)
	GetAPIKey(ctx context.Context, id string) (store.APIKey, error)
	SetKeyLimits(ctx context.Context, id string, l quota.Limits) (store.APIKey, error)
}

// Templates is what the API uses of the template store.
type Templates interface {
	Get(name string) (*template.Template, error)
	List() ([]*template.Template, error)
}

// Volumes is what the API uses of the volume manager.
type Volumes interface {
	Create(ctx context.Context, owner tenant.Owner, name string, sizeBytes int64) (volume.Volume, error)
	List(ctx context.Context, p tenant.Principal) ([]volume.Volume, error)
	Get(ctx context.Context, p tenant.Principal, ref string) (volume.Volume, error)
	Delete(ctx context.Context, p tenant.Principal, ref string, usedBy func(id string) []string) error
	// OpenContent opens a volume's file tree for its content token's bearer
	// or a principal that may act on it (volumecontent.go).
	OpenContent(ctx context.Context, id, token string, p *tenant.Principal) (*volume.Content, error)
}

// Secrets is what the API uses of the secret store.
type Secrets interface {
	Create(ctx context.Context, name, value string, md map[string]string) (secrets.Info, error)
	Update(ctx context.Context, ref, value string, md map[string]string) (secrets.Info, error)
	List() []secrets.Info
	Info(ref string) (secrets.Info, error)
	Get(name string) (string, error)
	Delete(ctx context.Context, ref string) error
}

// AuditLog is what the API uses of the audit log.
type AuditLog interface {
	Exists(sandboxID string) bool
	ReadWithStats(sandboxID string, q audit.Query) ([]audit.Entry, audit.Stats, error)
}

var (
	_ Sandboxes = (*sandbox.Manager)(nil)
	_ Pools     = (*sandbox.Manager)(nil)
	_ Keys      = (*store.Store)(nil)
	_ Templates = (*template.Store)(nil)
	_ Volumes   = (*volume.Manager)(nil)
	_ Secrets   = (*secrets.Manager)(nil)
	_ AuditLog  = (*audit.Log)(nil)
)
