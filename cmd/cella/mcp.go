package main

import (
	"os"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/mcpserver"
)

func newMCPCmd() *cobra.Command {
	var maxCalls int64
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve cella's sandbox tools to an MCP client over stdio",
		Long: `Serve cella's sandbox tools (sandbox_create, sandbox_exec, sandbox_write_file,
sandbox_read_file, sandbox_list_files, sandbox_run_code, sandbox_expose_port,
sandbox_kill, sandbox_list) to an MCP client over stdio. The tools act through
the daemon at CELLA_URL with the key from CELLA_API_KEY (or E2B_API_KEY, or
the admin key file). The daemon also serves the same tools at /mcp.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := client.FromEnv()
			if err != nil {
				return err
			}
			c, err := client.New(cfg)
			if err != nil {
				return err
			}
			network := ""
			if k, err := c.SelfKey(cmd.Context()); err == nil {
				// Without a flag, the key's own budget applies (cella key
				// create --mcp-max-calls), as it does on the daemon's /mcp.
				if maxCalls == 0 {
					maxCalls = k.MCPMaxCalls
				}
				network = k.Egress
			}
			s := mcpserver.New(mcpserver.Config{Client: c, DaemonURL: cfg.URL, MaxCalls: maxCalls, Network: network})
			return s.Run(cmd.Context(), &mcp.StdioTransport{})
		},
	}
	def, _ := strconv.ParseInt(os.Getenv("CELLA_MCP_MAX_CALLS"), 10, 64)
	cmd.Flags().Int64Var(&maxCalls, "max-calls", def, "tool calls this session may make, 0 = the key's own budget or unlimited [CELLA_MCP_MAX_CALLS]")
	return cmd
}
