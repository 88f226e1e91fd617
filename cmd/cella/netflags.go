package main

import (
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/egress"
)

// registerNetworkFlags adds the egress flags of `cella serve`. Lists read
// CELLA_* as comma-separated values.
func registerNetworkFlags(f *pflag.FlagSet, n *daemon.NetworkConfig) {
	envList := func(name string) []string {
		v := strings.TrimSpace(os.Getenv(name))
		if v == "" {
			return nil
		}
		return strings.Split(v, ",")
	}
	disabled, _ := strconv.ParseBool(os.Getenv("CELLA_NO_NETWORK"))
	f.BoolVar(&n.Disabled, "no-network", disabled, "give sandboxes no network at all, not even the egress proxy [CELLA_NO_NETWORK]")
	f.StringSliceVar(&n.Allow, "egress-allow", envList("CELLA_EGRESS_ALLOW"),
		"the egress ceiling: domains, *.wildcards, * (any name), IPs and CIDRs a sandbox may be allowed to reach; empty = no egress for anyone (repeatable) [CELLA_EGRESS_ALLOW]")
	f.StringSliceVar(&n.Deny, "egress-deny", envList("CELLA_EGRESS_DENY"),
		"never reachable, whatever a sandbox asks (repeatable) [CELLA_EGRESS_DENY]")
	f.StringSliceVar(&n.Resolve, "egress-resolve", envList("CELLA_EGRESS_RESOLVE"),
		"NAME=ADDR[:PORT][,ADDR[:PORT]...]: the proxy dials ADDR for NAME (or *.suffix) instead of asking DNS; a loopback ADDR lets exactly those names reach this host's loopback, only on PORT when given (tests, local mirrors) [CELLA_EGRESS_RESOLVE]")
	maxConns, _ := strconv.Atoi(envOr("CELLA_EGRESS_MAX_CONNS", strconv.Itoa(egress.DefaultMaxConnsPerSandbox)))
	f.IntVar(&n.MaxConnsPerSandbox, "egress-max-conns", maxConns,
		"connections one sandbox may hold open through the egress proxy; past it a connection is refused with a block event [CELLA_EGRESS_MAX_CONNS]")
	f.StringVar(&n.UpstreamCAFile, "egress-ca-file", os.Getenv("CELLA_EGRESS_CA_FILE"),
		"extra root certificates (PEM) the proxy trusts, beside the system's, to verify the upstreams of the TLS it terminates (private CAs) [CELLA_EGRESS_CA_FILE]")
	f.StringVar(&n.Prefix, "network-prefix", envOr("CELLA_NETWORK_PREFIX", "10.200.0.0/30"),
		"address pair of every sandbox's private link (first host: the gateway and resolver, second: the sandbox) [CELLA_NETWORK_PREFIX]")
	pool, _ := strconv.Atoi(envOr("CELLA_NETWORK_POOL", "4"))
	f.IntVar(&n.PoolSize, "network-pool", pool, "network slots made ahead so that create does not wait for them [CELLA_NETWORK_POOL]")
}
