package main

import (
	"github.com/spf13/cobra"
)

func newPauseCmd() *cobra.Command {
	var noMemory bool
	cmd := &cobra.Command{
		Use:   "pause ID [--no-memory]",
		Short: "Pause a sandbox; its processes and files survive until `cella resume`",
		Long: `Pause a sandbox. Its files survive, and so do its processes: under gVisor
they are checkpointed to disk and their memory freed, under the namespaces
runtime they are frozen in RAM. With --no-memory only the files are kept and
resume boots a fresh sandbox on them. A paused sandbox does not expire.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			return c.Pause(cmd.Context(), args[0], !noMemory)
		},
	}
	cmd.Flags().BoolVar(&noMemory, "no-memory", false, "keep only the filesystem (resume cold-boots the sandbox)")
	return cmd
}
