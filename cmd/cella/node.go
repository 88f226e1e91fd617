package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/drain"
)

// nodeConfig is where `cella node` finds the cluster.
type nodeConfig struct {
	Kubeconfig, Namespace string
}

func nodeSettings(c *nodeConfig) []*setting {
	return []*setting{
		{flag: "cluster", env: "CELLA_CLUSTER", kind: "path", apply: one(&c.Kubeconfig, text),
			usage: "the cluster's Kubernetes API: a kubeconfig file, or in-cluster (the pod's service account); default: $KUBECONFIG, then ~/.kube/config"},
		clusterNamespaceSetting(&c.Namespace),
	}
}

func newNodeCmd() *cobra.Command {
	var c nodeConfig
	cmd := &cobra.Command{
		Use:   "node",
		Short: "The nodes of a cella cluster: list, drain, undrain",
	}
	set := register(cmd.PersistentFlags(), nodeSettings(&c)...)
	kube := func() (ctrlclient.Client, error) {
		if err := set.resolve(); err != nil {
			return nil, err
		}
		return cluster.Connect(c.Kubeconfig)
	}

	var asJSON bool
	ls := &cobra.Command{
		Use:         "ls",
		Short:       "List the cluster's nodes: state (live, drained, lapsed), capacity, lease",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{errorPrefix: "cella node ls"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := kube()
			if err != nil {
				return err
			}
			nodes, err := cluster.Nodes(cmd.Context(), cl, c.Namespace)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(nodeRows(nodes))
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tSANDBOXES\tMEMORY FREE\tCPUS\tCPU IDLE\tRENEWED\tENDPOINT")
			now := time.Now()
			for _, n := range nodes {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d/%d MiB\t%d\t%.0f%%\t%s ago\t%s\n", n.Name, n.State(), n.Capacity.Sandboxes,
					n.Capacity.MemoryFreeBytes>>20, n.Capacity.MemoryTotalBytes>>20, n.Capacity.CPUs, 100*n.Capacity.CPUIdle,
					now.Sub(n.RenewedAt).Round(time.Second), n.Endpoint)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	drainCmd := &cobra.Command{
		Use:   "drain NODE",
		Short: "Stop placing sandboxes on NODE and pause every sandbox running there",
		Long: `Mark NODE drained (gateways place no new sandbox there) and pause each of
its running sandboxes with its memory, through the node's own API as the
cluster's admin, until none is left running. A paused sandbox resumes on its
next connect. Run it where the node's advertised URL is reachable (in a
cluster: kubectl exec into a gateway pod). cella node undrain NODE ends it.`,
		Args:        cobra.ExactArgs(1),
		Annotations: map[string]string{errorPrefix: "cella node drain"},
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := kube()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Minute)
			defer cancel()
			results, err := drain.Drain(ctx, drain.Config{Kube: cl, Namespace: c.Namespace, Node: args[0]})
			failed := 0
			for _, r := range results {
				if r.Err != nil {
					failed++
					fmt.Printf("%s\tfailed: %v\n", r.ID, r.Err)
					continue
				}
				fmt.Printf("%s\tpaused\n", r.ID)
			}
			if err != nil {
				return err
			}
			if failed > 0 {
				return fmt.Errorf("node %s is drained, but %d of its sandboxes could not be paused", args[0], failed)
			}
			fmt.Printf("node %s drained: %d sandboxes paused\n", args[0], len(results))
			return nil
		},
	}
	undrain := &cobra.Command{
		Use:         "undrain NODE",
		Short:       "Let gateways place sandboxes on NODE again",
		Args:        cobra.ExactArgs(1),
		Annotations: map[string]string{errorPrefix: "cella node undrain"},
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := kube()
			if err != nil {
				return err
			}
			return drain.Undrain(cmd.Context(), cl, c.Namespace, args[0])
		},
	}
	cmd.AddCommand(ls, drainCmd, undrain)
	return cmd
}

// nodeRow is a node in `cella node ls --json`.
type nodeRow struct {
	Name      string           `json:"name"`
	State     string           `json:"state"`
	Endpoint  string           `json:"endpoint"`
	RenewedAt time.Time        `json:"renewedAt"`
	Lease     string           `json:"leaseDuration"`
	Holder    string           `json:"holder"`
	DrainedAt *time.Time       `json:"drainedAt,omitempty"`
	Capacity  cluster.Capacity `json:"capacity"`
	Error     string           `json:"capacityError,omitempty"`
}

func nodeRows(nodes []cluster.NodeInfo) []nodeRow {
	out := []nodeRow{}
	for _, n := range nodes {
		r := nodeRow{Name: n.Name, State: n.State(), Endpoint: n.Endpoint, RenewedAt: n.RenewedAt, Lease: n.Duration.String(),
			Holder: n.Holder, Capacity: n.Capacity, Error: n.CapacityErr}
		if n.Drained() {
			t := n.DrainedAt
			r.DrainedAt = &t
		}
		out = append(out, r)
	}
	return out
}
