package daemon

import (
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/cella-sandbox/cella/internal/build"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/image"
	"github.com/cella-sandbox/cella/internal/network"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/gvisor"
	"github.com/cella-sandbox/cella/internal/sandbox"
)

// Config is the daemon's configuration. `cella serve` fills it from its
// settings table (cmd/cella/serveconfig.go: every field's flag, CELLA_*
// variable, default and doc, parsed into these types); tests and benchmarks
// fill it in Go. Validate checks every field, and parses what is still text
// (the egress lists and mappings, the CA file), before New starts anything.
type Config struct {
	DataDir   string
	CacheDir  string
	Runtime   string // runtime.GVisor or runtime.Namespaces
	Domain    string
	RunscPath string // required for gvisor
	// RunscDebugDir, if set, receives runsc's debug logs (for diagnosing
	// sandboxes that die).
	RunscDebugDir string
	// Agent is the agent binary new sandboxes boot with (cmd/cella-agent;
	// cella's own is embedded: agentbin.Binary).
	Agent []byte
	// MCPMaxCalls is the tool-call budget of each /mcp session (0 = none).
	MCPMaxCalls int64
	Log         *slog.Logger
	// AccessLog is where one JSON line per API request goes: a file
	// (appended), "-" for stderr, "" for nowhere (observe.go).
	AccessLog string
	// BuildProgress receives template build progress (default: the log).
	BuildProgress io.Writer
	// Lifecycle is the default idle/archive/delete policy of new sandboxes.
	Lifecycle sandbox.Lifecycle
	// MetricsInterval is how often sandboxes' resource use is sampled for
	// GET /sandboxes/{id}/metrics (0: sandbox.DefaultMetricsInterval).
	MetricsInterval time.Duration
	// Network is the egress configuration.
	Network NetworkConfig
	// Registry is how images are pulled (mirrors, plain-HTTP registries)
	// and MaxLayerSize the largest layer a pull unpacks (0: the default).
	Registry     image.Hosts
	MaxLayerSize int64
	// Pools are the warm pools' sizes by template (--pool); sizes set
	// through the API, kept in SQLite, override them (sandbox/pool.go).
	Pools map[string]int
	// AuditRetention is how long the audit log of a sandbox that no longer
	// exists is kept (0: 7 days).
	AuditRetention time.Duration
	// PoolMemoryBudget is what warm pools may hold beyond their set sizes
	// (--pool-memory-budget, bytes; 0: a quarter of the host's RAM).
	PoolMemoryBudget int64
	// Maxima bound every sandbox's limits (--max-cpus/memory/disk/pids);
	// zero fields are the host's (sandbox.HostMaxima of DataDir).
	Maxima sandbox.Maxima
	// Cluster makes the daemon a node of a cluster (--cluster; cluster.go).
	Cluster ClusterConfig
	// Archive keeps paused sandboxes in an object store (--archive;
	// archive.go).
	Archive ArchiveConfig
	// Build configures template builds (internal/build).
	Build BuildConfig
	// Builder, if set, runs the builds E2B's build API requests
	// (internal/builds) instead of the daemon's engine (tests' doubles).
	Builder build.Builder
	// WebhookAllow is where lifecycle webhooks may post (egress entries;
	// --webhook-allow). Empty: webhooks are off (internal/events).
	WebhookAllow []string

	// net is Network parsed by Validate.
	net parsedNetwork
}

// BuildConfig is how template builds run.
type BuildConfig struct {
	// EgressAllow is what build sandboxes may reach (--build-egress-allow);
	// empty: the daemon's ceiling (Network.Allow/Deny). The ceiling's deny
	// list holds for builds too.
	EgressAllow []string
	// Timeout bounds a build that asks for no other (0: build.DefaultTimeout);
	// ReadyTimeout the wait for a start command to be ready (0:
	// build.DefaultReadyTimeout).
	Timeout, ReadyTimeout time.Duration
}

// NetworkConfig is the daemon's egress configuration. The lists stay text,
// as operators and tests write them; Validate parses them.
type NetworkConfig struct {
	// Disabled runs sandboxes with no network at all (loopback only).
	Disabled bool
	// Allow and Deny are the operator's ceiling: what any sandbox may reach
	// at most (domains, *.wildcards, "*", IPs, CIDRs). Empty Allow is no
	// egress for anyone, whatever a request asks.
	Allow, Deny []string
	// Resolve maps names (or *.wildcards) to addresses the proxy dials
	// instead of asking DNS: "pkg.test=127.0.0.1:8080" (egress.ParseMappings).
	// A mapping to loopback lets exactly those names reach the daemon
	// host's loopback, on the mapping's port when it gives one.
	Resolve []string
	// UpstreamCAFile holds extra roots the proxy trusts, beside the
	// system's, when it verifies the upstreams of the TLS it terminates
	// (every TLS connection to a name).
	UpstreamCAFile string
	// MaxConnsPerSandbox is how many connections one sandbox may hold open
	// through the egress proxy (0: egress.DefaultMaxConnsPerSandbox).
	MaxConnsPerSandbox int
	// Prefix is the address pair every slot uses (zero:
	// network.DefaultPrefix); PoolSize how many slots are made ahead (0:
	// network.DefaultPoolSize).
	Prefix   netip.Prefix
	PoolSize int
}

// parsedNetwork is what Validate makes of a NetworkConfig.
type parsedNetwork struct {
	ceiling  egress.Policy
	mappings []egress.Mapping
	roots    *x509.CertPool // nil: the system's
	slots    network.Config // validated
}

// A FieldError is a Config value that does not validate. Field is its
// `cella serve` flag (without "--"), so that cmd/cella can name the flag or
// the CELLA_* variable the value came from.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return "--" + e.Field + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Err: fmt.Errorf(format, args...)}
}

// Validate checks the config, fills in the defaults of Log and
// BuildProgress and parses Network. Nothing in it touches the data dir but
// reading its free space (the disk maximum), so a bad value stops the
// daemon before anything starts.
func (c *Config) Validate() error {
	switch {
	case c.Runtime != runtime.GVisor && c.Runtime != runtime.Namespaces:
		return fieldErr("runtime", "%q: want %s or %s", c.Runtime, runtime.GVisor, runtime.Namespaces)
	case !filepath.IsAbs(c.DataDir):
		return fieldErr("data-dir", "%q is not an absolute path", c.DataDir)
	case !filepath.IsAbs(c.CacheDir):
		return fieldErr("cache-dir", "%q is not an absolute path", c.CacheDir)
	case c.Domain == "":
		return fieldErr("domain", "must not be empty")
	case c.Runtime == runtime.GVisor && c.RunscPath == "":
		return fieldErr("runsc", "the gvisor runtime needs the path of runsc")
	case len(c.Agent) == 0:
		return errors.New("the agent binary is required (daemon.Config.Agent)")
	case c.MCPMaxCalls < 0:
		return fieldErr("mcp-max-calls", "%d: want 0 (no limit) or more", c.MCPMaxCalls)
	case c.MetricsInterval != 0 && (c.MetricsInterval < 100*time.Millisecond || c.MetricsInterval > sandbox.MetricsRetention):
		return fieldErr("metrics-interval", "%v is out of range (100ms to %v)", c.MetricsInterval, sandbox.MetricsRetention)
	case c.AuditRetention < 0:
		return fieldErr("audit-retention", "%v must not be negative", c.AuditRetention)
	case c.MaxLayerSize < 0:
		return fieldErr("max-layer-size", "%d must not be negative", c.MaxLayerSize)
	case c.Build.Timeout < 0 || c.Build.Timeout > 24*time.Hour:
		return fieldErr("build-timeout", "%v is out of range (0 to 24h)", c.Build.Timeout)
	case c.Build.ReadyTimeout < 0 || c.Build.ReadyTimeout > 24*time.Hour:
		return fieldErr("build-ready-timeout", "%v is out of range (0 to 24h)", c.Build.ReadyTimeout)
	}
	if err := (egress.Policy{AllowOut: c.Build.EgressAllow}).Validate(); err != nil {
		return &FieldError{Field: "build-egress-allow", Err: err}
	}
	for _, l := range []struct {
		field string
		d     time.Duration
	}{{"auto-stop", c.Lifecycle.AutoStop}, {"auto-archive", c.Lifecycle.AutoArchive}, {"auto-delete", c.Lifecycle.AutoDelete}} {
		if l.d < 0 || l.d > sandbox.MaxLifecycleDuration {
			return fieldErr(l.field, "%v is out of range (0 to 10 years)", l.d)
		}
	}
	if c.PoolMemoryBudget < 0 {
		return fieldErr("pool-memory-budget", "%d: want a size of 0 or more", c.PoolMemoryBudget)
	}
	for name, n := range c.Pools {
		if strings.TrimSpace(name) == "" || n < 0 || n > sandbox.MaxPoolSize {
			return fieldErr("pool", "%q=%d: want a template name and a size between 0 and %d", name, n, sandbox.MaxPoolSize)
		}
	}
	if err := c.Cluster.validate(); err != nil {
		return err
	}
	if err := c.Archive.validate(); err != nil {
		return err
	}
	if c.Runtime == runtime.GVisor {
		p, err := exec.LookPath(c.RunscPath)
		if err == nil {
			err = gvisor.CheckBinary(p) // a cgo build boots no sandbox
		}
		if err != nil {
			return &FieldError{Field: "runsc", Err: err}
		}
	}
	if _, err := c.Maxima.Resolve(c.DataDir); err != nil { // the manager resolves them again; its errors name the flags
		return err
	}
	if !c.Network.Disabled {
		var err error
		if c.net, err = c.Network.parse(c.DataDir); err != nil {
			return err
		}
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.BuildProgress == nil {
		c.BuildProgress = logWriter{c.Log}
	}
	return nil
}

// parse checks and parses everything of n, the CA file read.
func (n NetworkConfig) parse(dataDir string) (parsedNetwork, error) {
	var p parsedNetwork
	if err := (egress.Policy{AllowOut: n.Allow}).Validate(); err != nil {
		return p, &FieldError{Field: "egress-allow", Err: err}
	}
	if err := (egress.Policy{DenyOut: n.Deny}).Validate(); err != nil {
		return p, &FieldError{Field: "egress-deny", Err: err}
	}
	var err error
	if p.ceiling, err = n.Ceiling(); err != nil {
		return p, err
	}
	if p.mappings, err = egress.ParseMappings(n.Resolve); err != nil {
		return p, &FieldError{Field: "egress-resolve", Err: err}
	}
	if n.UpstreamCAFile != "" {
		if p.roots, err = loadRoots(n.UpstreamCAFile); err != nil {
			return p, &FieldError{Field: "egress-ca-file", Err: err}
		}
	}
	if n.MaxConnsPerSandbox < 0 {
		return p, fieldErr("egress-max-conns", "%d: want a positive number of connections", n.MaxConnsPerSandbox)
	}
	if n.PoolSize < 0 {
		return p, fieldErr("network-pool", "%d must not be negative", n.PoolSize)
	}
	p.slots = network.DefaultConfig()
	p.slots.RunDir = filepath.Join(dataDir, "net")
	if n.PoolSize > 0 {
		p.slots.PoolSize = n.PoolSize
	}
	if n.Prefix.IsValid() {
		p.slots.Prefix = n.Prefix
	}
	if err := p.slots.Validate(); err != nil {
		return p, &FieldError{Field: "network-prefix", Err: err}
	}
	return p, nil
}

// buildEgress is the build sandboxes' policy: --build-egress-allow, else
// the ceiling; the ceiling's deny list either way. nil: no network.
func (c Config) buildEgress(ceiling egress.Policy) *egress.Policy {
	if c.Network.Disabled {
		return nil
	}
	if len(c.Build.EgressAllow) == 0 {
		return &ceiling
	}
	return &egress.Policy{AllowOut: c.Build.EgressAllow, DenyOut: c.Network.Deny}
}

// Ceiling is the parsed operator ceiling.
func (n NetworkConfig) Ceiling() (egress.Policy, error) {
	p := egress.Policy{AllowOut: n.Allow, DenyOut: n.Deny}
	if err := p.Validate(); err != nil {
		return egress.Policy{}, fmt.Errorf("egress ceiling (--egress-allow/--egress-deny): %w", err)
	}
	return p, nil
}

// loadRoots is the system's roots plus the PEM certificates of file.
func loadRoots(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return roots, nil
}
