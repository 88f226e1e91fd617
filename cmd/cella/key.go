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
	createQuota := addQuotaFlags(create)
	create.PreRunE = func(cmd *cobra.Command, _ []string) error {
		var err error
		nk.KeyUpdate, err = createQuota(cmd)
		return err
	}
	update := &cobra.Command{
		Use:   "update NAME|ID",
		Short: "Change an API key's quota (only the flags given change; 0 = unlimited)",
		Args:  cobra.ExactArgs(1),
	}
	updateQuota := addQuotaFlags(update)
	update.RunE = func(cmd *cobra.Command, args []string) error {
		u, err := updateQuota(cmd)
		if err != nil {
			return err
		}
		if u == (client.KeyUpdate{}) {
			return fmt.Errorf("nothing to change: give --max-sandboxes, --max-vcpus, --max-memory, --create-rate or --request-rate")
		}
		c, err := newClient()
		if err != nil {
			return err
		}
		k, err := c.UpdateKey(cmd.Context(), args[0], u)
		if err != nil {
			return err
		}
		fmt.Printf("key %s (%s): %s\n", k.ID, k.Name, quotaText(k.KeyLimits))
		return nil
	}
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
			fmt.Fprintln(tw, "ID\tNAME\tTEAM\tSECRETS\tMCP MAX CALLS\tQUOTA\tCREATED")
			for _, k := range keys {
				sec := strings.Join(k.Secrets, ",")
				if sec == "" {
					sec = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", k.ID, k.Name, k.Team, sec, k.MCPMaxCalls, quotaText(k.KeyLimits), k.CreatedAt.Format("2006-01-02 15:04"))
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
	cmd.AddCommand(create, update, ls, rm)
	return cmd
}

// addQuotaFlags gives cmd the quota flags and returns what reads the ones
// that were set.
func addQuotaFlags(cmd *cobra.Command) func(*cobra.Command) (client.KeyUpdate, error) {
	f := cmd.Flags()
	sandboxes := f.Int("max-sandboxes", 0, "running sandboxes the key may hold at once (paused ones do not count; 0 = unlimited)")
	vcpus := f.Int("max-vcpus", 0, "vCPUs of the key's running sandboxes together (0 = unlimited)")
	memory := f.String("max-memory", "", "memory of the key's running sandboxes together, e.g. 8G or 512M (0 = unlimited)")
	createRate := f.String("create-rate", "", "sandboxes the key may make per period, e.g. 60/m (N at once, then N per period; 0 = unlimited)")
	requestRate := f.String("request-rate", "", "API requests the key may make per period, e.g. 100/s (0 = unlimited)")
	return func(cmd *cobra.Command) (client.KeyUpdate, error) {
		var u client.KeyUpdate
		f := cmd.Flags()
		if f.Changed("max-sandboxes") {
			u.MaxSandboxes = sandboxes
		}
		if f.Changed("max-vcpus") {
			u.MaxVCPUs = vcpus
		}
		if f.Changed("max-memory") {
			var mib int64
			if *memory != "0" {
				var err error
				if mib, err = parseMiB(*memory); err != nil {
					return u, fmt.Errorf("--max-memory: %w", err)
				}
			}
			u.MaxMemoryMB = &mib
		}
		if f.Changed("create-rate") {
			u.CreateRate = createRate
		}
		if f.Changed("request-rate") {
			u.RequestRate = requestRate
		}
		return u, nil
	}
}

// quotaText is a key's quota in a few words.
func quotaText(l client.KeyLimits) string {
	var parts []string
	if l.MaxSandboxes > 0 {
		parts = append(parts, fmt.Sprintf("%d sandboxes", l.MaxSandboxes))
	}
	if l.MaxVCPUs > 0 {
		parts = append(parts, fmt.Sprintf("%d vCPUs", l.MaxVCPUs))
	}
	if l.MaxMemoryMB > 0 {
		parts = append(parts, fmt.Sprintf("%d MiB", l.MaxMemoryMB))
	}
	if l.CreateRate != "" {
		parts = append(parts, "creates "+l.CreateRate)
	}
	if l.RequestRate != "" {
		parts = append(parts, "requests "+l.RequestRate)
	}
	if len(parts) == 0 {
		return "unlimited"
	}
	return strings.Join(parts, ", ")
}
