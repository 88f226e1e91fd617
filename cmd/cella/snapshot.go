package main

import (
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func newSnapshotCmd() *cobra.Command {
	var name string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "snapshot ID [--name NAME] | snapshot ls | snapshot rm SNAPSHOT",
		Short: "Snapshot a running sandbox (it keeps running); create sandboxes from it with `cella create --template SNAPSHOT`",
		Long: `Snapshot a running sandbox: its files (a frozen copy of its writable layer)
and, under gVisor, its memory and processes (runsc checkpoint --leave-running).
The sandbox keeps running. Sandboxes created from the snapshot (its ID or
name as the template) start from that state; under the namespaces runtime
they boot fresh on its files.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			sn, err := c.Snapshot(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(sn)
			}
			fmt.Println(sn.SnapshotID)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "a name usable instead of the snapshot's ID")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var sandboxID string
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List snapshots",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			list, err := c.ListSnapshots(cmd.Context(), sandboxID)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(list)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAMES\tSANDBOX\tTEMPLATE\tMEMORY\tSIZE\tAGE")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%v\t%.1fMiB\t%s\n", s.SnapshotID, s.Names, s.SandboxID, s.TemplateID, s.Memory,
					float64(s.SizeBytes)/(1<<20), time.Since(s.CreatedAt).Round(time.Second))
			}
			return tw.Flush()
		},
	}
	ls.Flags().StringVar(&sandboxID, "sandbox", "", "only the snapshots of this sandbox")
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rm := &cobra.Command{
		Use:   "rm SNAPSHOT...",
		Short: "Delete snapshots (sandboxes made from them keep running)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.DeleteSnapshot(cmd.Context(), id); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.AddCommand(ls, rm)
	return cmd
}
