package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/cella-sandbox/cella/internal/api"
	"github.com/cella-sandbox/cella/internal/audit"
	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/network"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/secrets"
)

// newNetwork builds the slot manager and the egress proxy for sandboxes.
func newNetwork(c Config, log *slog.Logger, al *audit.Log, sm *secrets.Manager, denyUpstream func(netip.AddrPort) (string, bool), counts *api.EgressCounters, adoptable []string) (*sandbox.Network, func() error, error) {
	nc, parsed := c.Network, c.net // parsed by Config.Validate
	cfg := parsed.slots
	cfg.Adoptable = adoptable
	ca, err := egress.LoadOrCreateCA(filepath.Join(c.DataDir, "egress-ca"))
	if err != nil {
		return nil, nil, err
	}
	slots, err := network.New(cfg, log)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox networking does not work on this host, refusing to start (run with --no-network to give sandboxes no network at all): %w", err)
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
		Mappings:        parsed.mappings,
		Resolver:        resolveIPv4,
		HardDeny:        hardDeny,
		UpstreamRootCAs: parsed.roots,
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
	closeAll := func() error {
		errProxy, errSlots := proxy.Close(), slots.Close()
		blocks.flush() // what the daemon log held back is summed up before it stops
		return errors.Join(errProxy, errSlots)
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
