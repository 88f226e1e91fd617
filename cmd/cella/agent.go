package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/agent"
)

// newAgentCmd is the agent that runs as PID 1 inside every sandbox.
func newAgentCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "agent",
		Short:  "Run the in-sandbox agent (PID 1 of a sandbox)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			return agent.Main(ctx)
		},
	}
}
