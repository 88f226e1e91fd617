package main

import (
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func newLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			// Lost: a cluster gateway's sandboxes whose node cannot answer
			// (a node has none); E2B's default list leaves them out.
			list, err := c.ListStates(cmd.Context(), "running,paused,lost")
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTEMPLATE\tRUNTIME\tSTATE\tAGE\tEXPIRES IN\tCPUS\tMEMORY")
			now := time.Now()
			for _, d := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%g\t%dMiB\n", d.SandboxID, d.TemplateID, d.Runtime, d.State,
					now.Sub(d.StartedAt).Round(time.Second), d.EndAt.Sub(now).Round(time.Second), d.CPUCount, d.MemoryMB)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
