package main

import (
	"os"

	"github.com/spf13/cobra"
)

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "cella",
		Short:         "Disposable, isolated Linux sandboxes for AI agents",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		newServeCmd(),
		newGatewayCmd(), // gateway.go
		newNodeCmd(),    // node.go
		newCreateCmd(),
		newExecCmd(),
		newRunCmd(),
		newLsCmd(),
		newInfoCmd(),
		newKillCmd(),
		newTimeoutCmd(),
		newPauseCmd(),
		newResumeCmd(),
		newSnapshotCmd(),
		newForkCmd(),
		newCpCmd(),
		newShellCmd(),  // shell.go
		newWaitCmd(),   // wait.go
		newExposeCmd(), // expose.go
		newVolumeCmd(),
		newTemplateCmd(),
		newBenchCmd(),
		newMCPCmd(),
		newKeyCmd(),
		newSecretCmd(), // secret.go
		newPoolCmd(),   // pool.go
		newStatsCmd(),  // stats.go
	)
	return root
}

// envOr returns the environment variable name, or def when unset.
func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}
