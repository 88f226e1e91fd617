package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

func newTimeoutCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "timeout ID DURATION",
		Short: "Set a sandbox to expire DURATION from now (e.g. 10m)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := time.ParseDuration(args[1])
			if err != nil {
				return fmt.Errorf("duration %q: %w (use e.g. 90s, 10m, 2h)", args[1], err)
			}
			if d < 0 {
				return fmt.Errorf("duration must not be negative")
			}
			c, err := newClient()
			if err != nil {
				return err
			}
			return c.SetTimeout(cmd.Context(), args[0], d)
		},
	}
}
