package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/bench"
)

// newBenchStateCmd is `cella bench state`: pause, resume, snapshot and
// fork×N of a sandbox holding touched memory, beside a cold create.
func newBenchStateCmd(b *benchFlags) *cobra.Command {
	var mb, forks int
	cmd := &cobra.Command{
		Use:   "state",
		Short: "pause, resume, snapshot and fork×N of a sandbox holding 100 MB of touched memory, beside a cold create",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("runtimes") {
				b.runtimes = "gvisor"
			}
			if err := b.prepare(); err != nil {
				return err
			}
			if b.smoke {
				mb, forks = 8, 2
			}
			rs, err := bench.State(cmd.Context(), b.cfg, mb, forks)
			if err != nil {
				return err
			}
			if !b.cfg.JSON {
				fmt.Println("cella bench state: the cold create is measured in the same run")
			}
			return bench.PrintState(os.Stdout, rs, b.cfg.JSON)
		},
	}
	cmd.Flags().IntVar(&mb, "memory-mb", 100, "touched memory held by the sandbox's python process")
	cmd.Flags().IntVar(&forks, "forks", 20, "how many forks")
	return cmd
}
