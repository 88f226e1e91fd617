package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func newKillCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "kill ID...",
		Short: "Kill and remove sandboxes",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			failed := 0
			for _, id := range args {
				if err := c.Kill(cmd.Context(), id); err != nil {
					fmt.Fprintf(os.Stderr, "cella: kill %s: %v\n", id, err)
					failed++
					continue
				}
				fmt.Println(id)
			}
			if failed > 0 {
				return &exitError{code: 1}
			}
			return nil
		},
	}
}
