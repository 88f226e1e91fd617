package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
)

func newForkCmd() *cobra.Command {
	var count int
	var timeout time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "fork ID [--count N]",
		Short: "Start N sandboxes from a running sandbox's current state; the original keeps running",
		Long: `Fork a running sandbox: cella snapshots it (files and, under gVisor, memory and
processes) and starts --count sandboxes from that state. Forks share the
snapshot's files copy-on-write; changes in one are invisible to the others
and to the original. Prints one new sandbox ID per line.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			res, err := c.Fork(cmd.Context(), args[0], count, timeout)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(res)
			}
			var failed error
			for _, r := range res {
				if r.Sandbox != nil {
					fmt.Println(r.Sandbox.SandboxID)
				} else if r.Error != nil {
					fmt.Fprintf(os.Stderr, "fork failed: %d: %s\n", r.Error.Code, r.Error.Message)
					failed = errors.New("some forks failed")
				}
			}
			return failed
		},
	}
	cmd.Flags().IntVarP(&count, "count", "n", 1, "how many forks")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "TTL of the forks (default: the daemon's)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
