package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/client"
)

func newKeyCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "key", Short: "Manage API keys (with the admin key)"}
	var nk client.NewKey
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create an API key and print it (it is shown only once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			nk.Name = args[0]
			k, err := c.CreateKey(cmd.Context(), nk)
			if err != nil {
				return err
			}
			fmt.Println(k.Key)
			fmt.Fprintf(os.Stderr, "key %s (%s) of team %s created; store it now, cella keeps only its hash\n", k.ID, k.Name, k.Team)
			return nil
		},
	}
	create.Flags().StringVar(&nk.Team, "team", "", "the team the key joins (made if it does not exist; default: a team of its own, named after the key); a team's keys share its sandboxes, snapshots and volumes")
	create.Flags().StringSliceVar(&nk.Secrets, "secrets", nil, "secrets the key may attach to requests (network.rules) or put in environments (secretEnvVars); '*' for all (repeatable; default: none)")
	create.Flags().Int64Var(&nk.MCPMaxCalls, "mcp-max-calls", 0, "tool calls each MCP session with this key may make (0 = the daemon's default)")
	create.Flags().StringSliceVar(&nk.EgressAllow, "egress-allow", nil, "the key's own egress ceiling, within the daemon's (repeatable; default: the daemon's ceiling)")
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
			fmt.Fprintln(tw, "ID\tNAME\tTEAM\tSECRETS\tMCP MAX CALLS\tCREATED")
			for _, k := range keys {
				sec := strings.Join(k.Secrets, ",")
				if sec == "" {
					sec = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", k.ID, k.Name, k.Team, sec, k.MCPMaxCalls, k.CreatedAt.Format("2006-01-02 15:04"))
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
