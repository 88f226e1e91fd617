package main

import (
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/image"
	"github.com/cella-sandbox/cella/internal/layerstore"
	"github.com/cella-sandbox/cella/internal/network"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/sandbox"
)

// serveConfig is what `cella serve` runs with: the daemon's Config and the
// two settings that are the command's own.
type serveConfig struct {
	daemon.Config
	Listen   string
	LogLevel slog.Level
}

// serveSettings is every setting of `cella serve`, in the order of --help
// and of the README's Configuration table (TestReadmeConfiguration checks
// that the README shows exactly these). Each parses into its field of c;
// what needs the whole config (paths absolute, ranges, the egress lists,
// the CA file, the maxima against the host) daemon.Config.Validate checks.
func serveSettings(c *serveConfig) []*setting {
	l, n, mx, cl := &c.Lifecycle, &c.Network, &c.Maxima, &c.Cluster
	list := []*setting{
		{flag: "data-dir", env: "CELLA_DATA_DIR", def: "/var/lib/cella", kind: "path", apply: one(&c.DataDir, text),
			usage: "state directory: SQLite (cella.db), admin.key, sandboxes, volumes"},
		cacheDirSetting(&c.CacheDir),
		{flag: "listen", env: "CELLA_LISTEN", def: "127.0.0.1:3000", kind: "host:port", apply: one(&c.Listen, hostPort),
			usage: "address of the API and the sandbox proxy"},
		{flag: "runtime", env: "CELLA_RUNTIME", def: runtime.GVisor, kind: "name", apply: one(&c.Runtime, text),
			usage: "isolation runtime: gvisor or namespaces"},
		{flag: "domain", env: "CELLA_DOMAIN", def: "localhost", kind: "domain", apply: one(&c.Domain, text),
			usage: "domain of sandbox hosts: PORT-ID.DOMAIN"},
		{flag: "runsc", env: "CELLA_RUNSC", kind: "path", apply: one(&c.RunscPath, text),
			usage: "path of runsc (default: next to the cella binary, then $PATH)"},
		{flag: "runsc-debug-dir", env: "CELLA_RUNSC_DEBUG_DIR", kind: "path", apply: one(&c.RunscDebugDir, text),
			usage: "write runsc debug logs here (diagnostics)"},
		logLevelSetting(&c.LogLevel),
		{flag: "access-log", env: "CELLA_ACCESS_LOG", kind: "path", apply: one(&c.AccessLog, text),
			usage: "append one JSON line per API request to this file (key name, route, status, latency, sandbox and request IDs; never a key, token or secret); - = stderr; default: none"},
		{flag: "mcp-max-calls", env: "CELLA_MCP_MAX_CALLS", def: "0", kind: "int", apply: one(&c.MCPMaxCalls, integer[int64]),
			usage: "tool calls each /mcp session may make; 0 = unlimited"},

		{flag: "auto-stop", env: "CELLA_AUTO_STOP", def: "0", kind: "duration", apply: one(&l.AutoStop, parseLifeDuration),
			usage: "default: pause a running sandbox after this long idle (no exec, file op or proxied traffic), e.g. 15m or 7d; 0 = off"},
		{flag: "auto-archive", env: "CELLA_AUTO_ARCHIVE", def: "0", kind: "duration", apply: one(&l.AutoArchive, parseLifeDuration),
			usage: "default: archive a paused sandbox (checkpoint and files compressed to DATA-DIR/archive, its layer freed) after this long; 0 = off"},
		{flag: "auto-delete", env: "CELLA_AUTO_DELETE", def: "0", kind: "duration", apply: one(&l.AutoDelete, parseLifeDuration),
			usage: "default: delete a paused sandbox after this long; 0 = off", more: "(see Lifecycle policies)"},
		{flag: "webhook-allow", env: "CELLA_WEBHOOK_ALLOW", kind: "entries", list: true, apply: all(&c.WebhookAllow, texts),
			usage: "where lifecycle webhooks (/events/webhooks) may post: names, *.wildcards, IPs and CIDRs; a name reaches only public addresses, loopback and private ones need an IP/CIDR entry; none = webhooks off",
			more:  "(see Lifecycle events and webhooks)"},
		{flag: "audit-retention", env: "CELLA_AUDIT_RETENTION", def: "7d", kind: "duration", apply: one(&c.AuditRetention, parseLifeDuration),
			usage: "how long the audit log of a sandbox that is gone is kept, e.g. 7d or 12h"},
		{flag: "metrics-interval", env: "CELLA_METRICS_INTERVAL", def: sandbox.DefaultMetricsInterval.String(), kind: "duration", apply: one(&c.MetricsInterval, time.ParseDuration),
			usage: "how often each running sandbox's CPU, memory and disk use is sampled, 100ms to 1h (an hour of samples is kept)"},
		{flag: "pool", env: "CELLA_POOL", kind: "TEMPLATE=N", list: true, apply: all(&c.Pools, poolSizes),
			usage: "keep N sandboxes of TEMPLATE started and ready, handed out on create; a size set with cella pool set overrides it",
			more:  "(see Warm pools)"},
		{flag: "pool-memory-budget", env: "CELLA_POOL_MEMORY_BUDGET", def: "0", kind: "size", apply: one(&c.PoolMemoryBudget, maxBytes),
			usage: "memory warm pools may hold beyond their set sizes while recent demand (the most creates within a second over the last minute) grows them, e.g. 4G; 0 = a quarter of the host's RAM",
			more:  "(see Warm pools)"},

		{flag: "no-network", env: "CELLA_NO_NETWORK", def: "false", kind: "bool", apply: one(&n.Disabled, boolean),
			usage: "give sandboxes no network at all, not even the egress proxy (loopback only)"},
		{flag: "egress-allow", env: "CELLA_EGRESS_ALLOW", kind: "entries", list: true, apply: all(&n.Allow, texts),
			usage: "the egress ceiling: domains, *.wildcards, * (any name), IPs and CIDRs a sandbox may be allowed to reach; none = no egress for any sandbox",
			more:  "(see Network and credentials)"},
		{flag: "egress-deny", env: "CELLA_EGRESS_DENY", kind: "entries", list: true, apply: all(&n.Deny, texts),
			usage: "never reachable, whatever a sandbox asks"},
		{flag: "egress-resolve", env: "CELLA_EGRESS_RESOLVE", kind: "NAME=ADDR[:PORT]", list: true, apply: all(&n.Resolve, texts),
			usage: "NAME=ADDR[:PORT][,ADDR[:PORT]...]: the proxy dials ADDR for NAME (or *.suffix) instead of asking DNS; a loopback ADDR lets exactly those names reach this host's loopback, only on PORT when given (local mirrors, tests)",
			more:  "(a port is refused on other addresses)"},
		{flag: "egress-max-conns", env: "CELLA_EGRESS_MAX_CONNS", def: strconv.Itoa(egress.DefaultMaxConnsPerSandbox), kind: "int", apply: one(&n.MaxConnsPerSandbox, integer[int]),
			usage: "connections one sandbox may hold open through the egress proxy; past it a connection is refused with a block event"},
		{flag: "egress-ca-file", env: "CELLA_EGRESS_CA_FILE", kind: "path", apply: one(&n.UpstreamCAFile, text),
			usage: "extra root certificates (PEM) the proxy trusts, beside the system's, to verify the upstreams of the TLS it terminates (private CAs)"},
		{flag: "network-prefix", env: "CELLA_NETWORK_PREFIX", def: network.DefaultPrefix.String(), kind: "prefix", apply: one(&n.Prefix, prefix),
			usage: "address pair of every sandbox's private link (first host: the gateway and resolver, second: the sandbox); IPv4, /30 or larger"},
		{flag: "network-pool", env: "CELLA_NETWORK_POOL", def: strconv.Itoa(network.DefaultPoolSize), kind: "int", apply: one(&n.PoolSize, integer[int]),
			usage: "network slots made ahead so that create does not wait for them"},

		{flag: "build-egress-allow", env: "CELLA_BUILD_EGRESS_ALLOW", kind: "entries", list: true, apply: all(&c.Build.EgressAllow, texts),
			usage: "what template build steps (RUN, apt-get, pip) may reach, as --egress-allow entries; none = the egress ceiling (--egress-deny holds for builds too)",
			more:  "(see Dockerfiles and builds)"},
		{flag: "build-timeout", env: "CELLA_BUILD_TIMEOUT", def: build.DefaultTimeout.String(), kind: "duration", apply: one(&c.Build.Timeout, time.ParseDuration),
			usage: "the longest a template build may take, every step and the ready wait included"},
		{flag: "build-ready-timeout", env: "CELLA_BUILD_READY_TIMEOUT", def: build.DefaultReadyTimeout.String(), kind: "duration", apply: one(&c.Build.ReadyTimeout, time.ParseDuration),
			usage: "how long a build retries a template's ready command (every 2 s) before it fails"},

		{flag: "max-cpus", env: "CELLA_MAX_CPUS", def: "0", kind: "cpus", apply: one(&mx.CPUs, cpus),
			usage: "most CPUs a sandbox may ask for; 0 = the host's cores"},
		{flag: "max-memory", env: "CELLA_MAX_MEMORY", def: "0", kind: "size", apply: one(&mx.MemoryMB, maxMiB),
			usage: "most memory a sandbox may ask for, e.g. 16G; 0 = the host's RAM"},
		{flag: "max-disk", env: "CELLA_MAX_DISK", def: "0", kind: "size", apply: one(&mx.DiskMB, maxMiB),
			usage: "largest writable layer a sandbox may ask for, e.g. 8G; 0 = the smaller of the host's RAM and the data dir's free space at start"},
		{flag: "max-pids", env: "CELLA_MAX_PIDS", def: "0", kind: "int", apply: one(&mx.Pids, integer[int64]),
			usage: fmt.Sprintf("most processes a sandbox may ask for; 0 = %d", sandbox.DefaultMaxPids)},

		{flag: "cluster", env: "CELLA_CLUSTER", kind: "path", apply: one(&cl.Kubeconfig, text),
			usage: "join a cella cluster whose state is in Kubernetes: a kubeconfig file, or in-cluster (the pod's service account); none = a standalone daemon",
			more:  "(see Run on Kubernetes)"},
		{flag: "node-name", env: "CELLA_NODE_NAME", kind: "name", apply: one(&cl.NodeName, text),
			usage: "this daemon's name in the cluster (its Lease cella-node-NAME); a-z, 0-9 and '-', unique per daemon"},
		clusterNamespaceSetting(&cl.Namespace),
		{flag: "advertise-url", env: "CELLA_ADVERTISE_URL", kind: "URL", apply: one(&cl.Endpoint, text),
			usage: "the URL gateways reach this daemon at (default: http://LISTEN)"},
		{flag: "lease-duration", env: "CELLA_LEASE_DURATION", def: "10s", kind: "duration", apply: one(&cl.LeaseDuration, time.ParseDuration),
			usage: "how long one renewal of the node's Lease keeps it alive (renewed every third of it), 3s to 10m"},
		{flag: "template-registry", env: "CELLA_TEMPLATE_REGISTRY", kind: "HOST[:PORT]/PREFIX", apply: one(&cl.TemplateRegistry, text),
			usage: "with --cluster: the registry where templates built over the API are pushed (HOST[:PORT]/PREFIX/<templateID>:<buildID>) and other nodes pull them from on first use (a plain-HTTP one needs --insecure-registry HOST[:PORT]); none = API builds stay on their node",
			more:  "(see Run on Kubernetes)"},
		{flag: "archive", env: "CELLA_ARCHIVE", kind: "URL", apply: one(&c.Archive.URL, text),
			usage: "keep paused sandboxes in this S3 bucket (s3://BUCKET/PREFIX; credentials and region from the usual AWS environment and files), sealed with the archive key (the cluster's, or derived from master.key): a pause uploads, a resume on any node pulls; none = paused sandboxes stay on this host",
			more:  "(see Sandboxes that outlive their node)"},
		{flag: "archive-endpoint", env: "CELLA_ARCHIVE_ENDPOINT", kind: "URL", apply: one(&c.Archive.Endpoint, text),
			usage: "the URL of an S3-compatible server for --archive (addressed path-style); none = AWS"},
	}
	return append(list, registrySettings(&c.Registry, &c.MaxLayerSize)...)
}

// logLevelSetting is --log-level, of cella serve and cella gateway.
func logLevelSetting(dst *slog.Level) *setting {
	return &setting{flag: "log-level", env: "CELLA_LOG_LEVEL", def: "info", kind: "level", apply: one(dst, logLevel),
		usage: "debug, info, warn or error"}
}

// clusterNamespaceSetting is --cluster-namespace, of cella serve and cella
// gateway.
func clusterNamespaceSetting(dst *string) *setting {
	return &setting{flag: "cluster-namespace", env: "CELLA_CLUSTER_NAMESPACE", def: cluster.DefaultNamespace, kind: "name", apply: one(dst, text),
		usage: "the Kubernetes namespace of the cluster's Leases and records"}
}

// cacheDirSetting is --cache-dir, of cella serve and cella template.
func cacheDirSetting(dst *string) *setting {
	return &setting{flag: "cache-dir", env: "CELLA_CACHE_DIR", def: "/var/cache/cella", kind: "path", apply: one(dst, text),
		usage: "template cache (layers, images, leases), shared by every daemon and CLI on the machine"}
}

// registrySettings are how images are pulled, for cella serve and cella
// template: one environment serves both.
func registrySettings(h *image.Hosts, maxLayer *int64) []*setting {
	return []*setting{
		{flag: "registry-mirror", env: "CELLA_REGISTRY_MIRROR", kind: "REGISTRY=URL", list: true, apply: all(&h.Mirrors, mirrors),
			usage: "pull REGISTRY's images from the mirror at URL first, as containerd's hosts.toml does (an http URL is plain HTTP), e.g. docker.io=http://127.0.0.1:5000",
			more:  "(see Templates from images)"},
		{flag: "insecure-registry", env: "CELLA_INSECURE_REGISTRY", kind: "HOST[:PORT]", list: true, apply: all(&h.Insecure, texts),
			usage: "a registry spoken to over plain HTTP (or HTTPS without certificate checks)"},
		{flag: "max-layer-size", env: "CELLA_MAX_LAYER_SIZE", def: fmt.Sprintf("%dG", layerstore.DefaultMaxLayerSize>>30), kind: "size", apply: one(maxLayer, bytesOfMiB),
			usage: "the largest image layer a pull unpacks (compressed or not), e.g. 8G or 512M"},
	}
}

// The parsers of setting values. Their errors quote the value; resolve
// puts the flag or variable in front.

func text(s string) (string, error) { return s, nil }

func texts(vals []string) ([]string, error) { return vals, nil }

func hostPort(s string) (string, error) {
	if _, _, err := net.SplitHostPort(s); err != nil {
		return "", fmt.Errorf("%q: want HOST:PORT, e.g. 127.0.0.1:3000", s)
	}
	return s, nil
}

func logLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("%q: want debug, info, warn or error", s)
	}
	return l, nil
}

// boolean is strict: "yes" is an error, not false.
func boolean(s string) (bool, error) {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, fmt.Errorf("%q is not a boolean (want true or false)", s)
	}
	return b, nil
}

func integer[T int | int64](s string) (T, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || int64(T(n)) != n {
		return 0, fmt.Errorf("%q is not a whole number", s)
	}
	if n < 0 {
		return 0, fmt.Errorf("%q: want 0 or more", s)
	}
	return T(n), nil
}

func cpus(s string) (float64, error) {
	n, err := strconv.ParseFloat(s, 64)
	if err != nil || n < 0 || math.IsNaN(n) || math.IsInf(n, 0) {
		return 0, fmt.Errorf("invalid CPU count %q (use e.g. 8 or 0.5; 0 = the host's cores)", s)
	}
	return n, nil
}

// maxMiB is a size in MiB (parseMiB), where 0 is the host's.
func maxMiB(s string) (int64, error) {
	if s == "0" {
		return 0, nil
	}
	return parseMiB(s)
}

// maxBytes is maxMiB in bytes.
func maxBytes(s string) (int64, error) {
	mib, err := maxMiB(s)
	return mib << 20, err
}

func bytesOfMiB(s string) (int64, error) {
	mib, err := parseMiB(s)
	return mib << 20, err
}

func prefix(s string) (netip.Prefix, error) {
	if s == "" {
		return netip.Prefix{}, nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return p, fmt.Errorf("%q: want an IPv4 prefix, e.g. %s", s, network.DefaultPrefix)
	}
	return p, nil
}

func poolSizes(vals []string) (map[string]int, error) {
	sizes := map[string]int{}
	if err := parsePoolSizes(strings.Join(vals, ","), sizes); err != nil {
		return nil, err
	}
	return sizes, nil
}

// mirrors parses REGISTRY=URL items into image.Hosts' mirror map.
func mirrors(vals []string) (map[string][]string, error) {
	var h image.Hosts
	for _, v := range vals {
		if err := h.AddMirror(v); err != nil {
			return nil, err
		}
	}
	return h.Mirrors, nil
}
