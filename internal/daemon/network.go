package daemon

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/cella-sandbox/cella/internal/api"
	"github.com/cella-sandbox/cella/internal/audit"
	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/network"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/secrets"
)

// NetworkConfig is the daemon's egress configuration.
type NetworkConfig struct {
	// Disabled runs sandboxes with no network at all (loopback only).
	Disabled bool
	// Allow and Deny are the operator's ceiling: what any sandbox may reach
	// at most (domains, *.wildcards, "*", IPs, CIDRs). Empty Allow is no
	// egress for anyone, whatever a request asks.
	Allow, Deny []string
	// Resolve maps names (or *.wildcards) to addresses the proxy dials
	// instead of asking DNS: "pkg.test=127.0.0.1:8080" (egress.ParseMapping).
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
	// Prefix is the address pair every slot uses; PoolSize how many slots
	// are made ahead.
	Prefix   string
	PoolSize int
}

// Ceiling is the parsed operator ceiling.
func (n NetworkConfig) Ceiling() (egress.Policy, error) {
	p := egress.Policy{AllowOut: n.Allow, DenyOut: n.Deny}
	if err := p.Validate(); err != nil {
		return egress.Policy{}, fmt.Errorf("egress ceiling (--egress-allow/--egress-deny): %w", err)
	}
	return p, nil
}

// newNetwork builds the slot manager and the egress proxy for sandboxes.
func newNetwork(c Config, log *slog.Logger, al *audit.Log, sm *secrets.Manager, denyUpstream func(netip.AddrPort) (string, bool), counts *api.EgressCounters, adoptable []string) (*sandbox.Network, func(), error) {
	nc := c.Network
	cfg := network.DefaultConfig()
	cfg.RunDir = filepath.Join(c.DataDir, "net")
	cfg.Adoptable = adoptable
	if nc.PoolSize > 0 {
		cfg.PoolSize = nc.PoolSize
	}
	if nc.Prefix != "" {
		p, err := netip.ParsePrefix(nc.Prefix)
		if err != nil {
			return nil, nil, fmt.Errorf("network prefix %q: %w", nc.Prefix, err)
		}
		cfg.Prefix = p
	}
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	if nc.MaxConnsPerSandbox < 0 {
		return nil, nil, fmt.Errorf("--egress-max-conns %d: want a positive number of connections", nc.MaxConnsPerSandbox)
	}
	mappings, err := egress.ParseMappings(nc.Resolve)
	if err != nil {
		return nil, nil, fmt.Errorf("--egress-resolve: %w", err)
	}
	var roots *x509.CertPool
	if nc.UpstreamCAFile != "" {
		pem, err := os.ReadFile(nc.UpstreamCAFile)
		if err != nil {
			return nil, nil, fmt.Errorf("egress upstream CA file: %w", err)
		}
		if roots, err = x509.SystemCertPool(); err != nil || roots == nil {
			roots = x509.NewCertPool()
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("egress upstream CA file %s holds no PEM certificate", nc.UpstreamCAFile)
		}
	}
	ca, err := egress.LoadOrCreateCA(filepath.Join(c.DataDir, "egress-ca"))
	if err != nil {
		return nil, nil, err
	}
	slots, err := network.New(cfg, log)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox networking does not work on this host, refusing to start (run with --network=false to give sandboxes no network at all): %w", err)
	}
	// The slot pair is unreachable anyway; the host's own addresses must
	// never be dialed on a sandbox's behalf, whatever the policy says.
	hardDeny := []netip.Prefix{cfg.Prefix}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(ipn.IP); ok && !ip.Unmap().IsLoopback() {
					hardDeny = append(hardDeny, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
				}
			}
		}
	}
	proxy := egress.New(egress.Config{
		Mappings:        mappings,
		Resolver:        resolveIPv4,
		HardDeny:        hardDeny,
		UpstreamRootCAs: roots,
		CA:              ca,
		Secrets:         sm.Get,
		OperatorHint:    "cella serve --egress-allow <host> (the daemon's ceiling), then the sandbox's network.allowOut or PUT /sandboxes/{id}/network",
		DenyUpstream:    denyUpstream,
		Limits:          egressLimits(nc.MaxConnsPerSandbox, log), // fdlimit.go
	})
	blocks := newBlockLog(log) // blocklog.go
	events := func(e egress.Event) {
		entry := audit.Entry{
			Time: e.Time, SandboxID: e.SandboxID, Kind: e.Kind, Source: audit.SourceProxy, Proto: e.Proto,
			Dst: e.Dst, Host: e.Host, Upstream: e.Upstream, Decision: e.Decision, Rule: e.Rule, Reason: e.Reason,
			BytesOut: e.BytesOut, BytesIn: e.BytesIn,
		}
		al.Append(entry)
		if e.Decision != audit.DecisionBlocked {
			counts.Allowed.Add(1)
			return
		}
		counts.Blocked.Add(1)
		blocks.record(e)
	}
	closeAll := func() {
		proxy.Close()
		slots.Close()
		blocks.flush() // what the daemon log held back is summed up before it stops
	}
	log.Info("sandbox networking ready", "ceiling", ceilingText(nc), "slot_pool", cfg.PoolSize, "run_dir", cfg.RunDir)
	return &sandbox.Network{Slots: slots, Proxy: proxy, CAPEM: ca.CertPEM(), Events: events, Nameserver: cfg.HostIP()}, closeAll, nil
}

func ceilingText(nc NetworkConfig) string {
	if len(nc.Allow) == 0 {
		return "no egress (no --egress-allow)"
	}
	s := "allow " + strings.Join(nc.Allow, ",")
	if len(nc.Deny) > 0 {
		s += " deny " + strings.Join(nc.Deny, ",")
	}
	return s
}

// resolveIPv4 asks DNS for the names no --egress-resolve mapping answers:
// sandboxes are IPv4-only.
func resolveIPv4(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
}
