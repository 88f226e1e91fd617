package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/client"
)

func newVolumeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Manage named volumes: persistent directories mounted into sandboxes (--volume NAME:/path[:ro])",
	}
	var size string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a volume (an ext4 image of --size, ENOSPC at the limit)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mb, err := parseMiB(size)
			if err != nil {
				return fmt.Errorf("--size: %w", err)
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			v, err := c.CreateVolume(cmd.Context(), args[0], mb)
			if err != nil {
				return err
			}
			fmt.Println(v.Name)
			return nil
		},
	}
	create.Flags().StringVar(&size, "size", "", "size limit, e.g. 512M or 10G (default 1G)")
	var asJSON bool
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List volumes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			vs, err := c.ListVolumes(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(vs)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSIZE\tUSED\tSANDBOXES\tCREATED")
			for _, v := range vs {
				fmt.Fprintf(tw, "%s\t%dM\t%.1fM\t%d\t%s\n", v.Name, v.SizeMB, float64(v.UsedBytes)/(1<<20), len(v.UsedBy), v.CreatedAt.Local().Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rm := newRmCmd("rm NAME...", "Delete volumes and their data (refused while a sandbox mounts one)", func(ctx context.Context, c *client.Client, n string) error {
		return c.DeleteVolume(ctx, n)
	})
	cmd.AddCommand(create, ls, rm)
	return cmd
}
