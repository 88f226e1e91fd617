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

// newAgentExecCmd is the helper the agent re-executes to apply Landlock to a
// command before exec'ing it. Its arguments belong to the command, so cobra
// must not parse them.
func newAgentExecCmd() *cobra.Command {
	return &cobra.Command{
		Use:                agent.ExecHelperCommand + " MODE EXECUTABLE ARGV0 [ARG...]",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			err := agent.ExecHelperMain(args)
			// ExecHelperMain only returns on failure; 126 is the shell's
			// "found but could not be executed".
			return &exitError{code: 126, msg: err.Error()}
		},
	}
}
