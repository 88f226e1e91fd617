package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/bench"
	"github.com/cella-sandbox/cella/internal/cluster"
)

// newBenchClusterCmd is `cella bench cluster`: create latency through a
// gateway beside directly on a node of a running cluster, and a paused
// sandbox's resume on another node beside on its own.
func newBenchClusterCmd(b *benchFlags) *cobra.Command {
	var c nodeConfig
	var cc bench.ClusterConfig
	var set *settings
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "create→first-exec latency through a cluster's gateway beside directly on a node; cross-node resume beside local resume",
		Long: `Measure a running cluster: --gateway is one of its gateways; the node is
--node, else the first live node of --cluster; the key is --key (or
CELLA_API_KEY), else the cluster's admin key read from --cluster.

The resume figures need --cluster, two live undrained nodes and an archive
(nodes started with --archive s3://…): each round pauses a sandbox and
resumes it on its own node, then pauses it again, marks its node drained
for the length of one resume (no placement there meanwhile; the node's
other sandboxes are left alone) and resumes it through the gateway on
another node. Without them those figures carry an error saying what is
missing. An interrupt removes the mark before the bench exits; were the
bench killed outright in that window, 'cella node undrain NODE' removes it.`,
		Args:        cobra.NoArgs,
		Annotations: map[string]string{errorPrefix: "cella bench cluster"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := set.resolve(); err != nil {
				return err
			}
			if cc.GatewayURL == "" {
				return fmt.Errorf("--gateway: required (the URL of one of the cluster's gateways)")
			}
			if err := fromCluster(cmd.Context(), c, &cc); err != nil {
				if cc.NodeURL == "" || cc.APIKey == "" {
					return err
				}
				cc.KubeErr = err.Error() // the create figures need no API; the resume figures say why they are missing
			}
			// Unset, a cluster's burst is bench.Cluster's default, not
			// the single-node bench's 50.
			cc.N = b.cfg.N
			if cmd.Flags().Changed("concurrent") {
				cc.Concurrent = b.burst
			}
			if b.smoke {
				cc.N = 3
				if cc.Concurrent == 0 {
					cc.Concurrent = 4
				}
			}
			// An interrupt ends the bench through its context, so a round
			// that marked a node drained removes the mark before it exits.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			figs, err := bench.Cluster(ctx, cc)
			if figs != nil {
				if !b.cfg.JSON {
					fmt.Println("cella bench cluster: the node's figures measured in the same run, alternating")
				}
				if perr := bench.Print(os.Stdout, figs, b.cfg.JSON); perr != nil && err == nil {
					err = perr
				}
			}
			return err
		},
	}
	set = register(cmd.Flags(), nodeSettings(&c)...)
	cmd.Flags().StringVar(&cc.GatewayURL, "gateway", "", "URL of one of the cluster's gateways")
	cmd.Flags().StringVar(&cc.NodeURL, "node", "", "URL of one of its nodes (default: the first live node's advertised URL)")
	cmd.Flags().StringVar(&cc.APIKey, "key", os.Getenv("CELLA_API_KEY"), "API key (default: the cluster's admin key) [CELLA_API_KEY]")
	return cmd
}

// fromCluster connects to the cluster's API (for the resume figures) and
// fills in a node and the admin key from it where not given.
func fromCluster(ctx context.Context, c nodeConfig, cc *bench.ClusterConfig) error {
	cl, err := cluster.Connect(c.Kubeconfig)
	if err != nil {
		return err
	}
	cc.Kube, cc.Namespace = cl, c.Namespace
	if cc.APIKey == "" {
		if cc.APIKey, err = cluster.ReadAdminKey(ctx, cl, c.Namespace); err != nil {
			return err
		}
	}
	if cc.NodeURL != "" {
		return nil
	}
	nodes, err := cluster.Nodes(ctx, cl, c.Namespace)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n.Live && n.Endpoint != "" {
			cc.NodeURL = n.Endpoint
			return nil
		}
	}
	return fmt.Errorf("no live node in namespace %s (%d known): give --node", c.Namespace, len(nodes))
}
