package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newResumeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "resume ID",
		Short: "Resume a paused sandbox (its time left restarts at the default 5m at least)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			_, resumed, err := c.ConnectResumed(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if !resumed {
				fmt.Fprintf(cmd.ErrOrStderr(), "cella: sandbox %s was already running\n", args[0])
			}
			return nil
		},
	}
}
