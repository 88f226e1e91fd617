package main

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func newKeyCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "key", Short: "Manage API keys (with the admin key)"}
	var budget int64
	var egressAllow []string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create an API key and print it (it is shown only once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			k, err := c.CreateKey(cmd.Context(), args[0], budget, egressAllow...)
			if err != nil {
				return err
			}
			fmt.Println(k.Key)
			fmt.Fprintf(os.Stderr, "key %s (%s) created; store it now, cella keeps only its hash\n", k.ID, k.Name)
			return nil
		},
	}
	create.Flags().Int64Var(&budget, "mcp-max-calls", 0, "tool calls each MCP session with this key may make (0 = the daemon's default)")
	create.Flags().StringSliceVar(&egressAllow, "egress-allow", nil, "the key's own egress ceiling, within the daemon's (repeatable; default: the daemon's ceiling)")
	ls := &cobra.Command{
		Use: "ls", Short: "List API keys", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			keys, err := c.Keys(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tMCP MAX CALLS\tCREATED")
			for _, k := range keys {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", k.ID, k.Name, k.MCPMaxCalls, k.CreatedAt.Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use: "rm ID...", Short: "Delete API keys", Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.DeleteKey(cmd.Context(), id); err != nil {
					return fmt.Errorf("delete key %s: %w", id, err)
				}
			}
			return nil
		},
	}
	cmd.AddCommand(create, ls, rm)
	return cmd
}
