package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/client"
)

// newRmCmd is the `rm NAME...` subcommand of the verbs that manage named
// things (volumes, secrets): one delete per argument, stopping at the first
// failure and naming it.
func newRmCmd(use, short string, del func(ctx context.Context, c *client.Client, name string) error) *cobra.Command {
	return &cobra.Command{
		Use:     use,
		Aliases: []string{"delete"},
		Short:   short,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			for _, n := range args {
				if err := del(cmd.Context(), c, n); err != nil {
					return fmt.Errorf("%s: %w", n, err)
				}
			}
			return nil
		},
	}
}
