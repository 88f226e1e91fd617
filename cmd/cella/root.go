package main

import (
	"os"
	"strconv"
	"time"

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
		newAgentCmd(),
		newAgentExecCmd(),
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

func envInt(name string, def int64) int64 {
	if v, err := strconv.ParseInt(os.Getenv(name), 10, 64); err == nil {
		return v
	}
	return def
}

func envFloat(name string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return v
	}
	return def
}
