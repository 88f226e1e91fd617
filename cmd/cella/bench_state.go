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
	var mb, forks, rounds int
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
				mb, forks, rounds = stateSize(true)
			}
			rs, err := bench.State(cmd.Context(), b.cfg, mb, forks, rounds)
			if err != nil {
				return err
			}
			if !b.cfg.JSON {
				fmt.Println("cella bench state: the cold create and the raw runsc floors are measured in the same run")
			}
			if err := bench.PrintState(os.Stdout, rs, b.cfg.JSON); err != nil {
				return err
			}
			if b.smoke {
				// A smoke run keeps every figure and floor working.
				for _, r := range rs {
					if err := r.Check(); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}
	mb, forks, rounds = stateSize(false)
	cmd.Flags().IntVar(&mb, "memory-mb", mb, "touched memory held by the sandbox's python process")
	cmd.Flags().IntVar(&forks, "forks", forks, "how many forks")
	cmd.Flags().IntVar(&rounds, "rounds", rounds, "pause/resume rounds, each resume beside a raw runsc restore")
	return cmd
}

// stateSize is what `cella bench state` (and bench all) measures: the
// issue's 100 MiB and 20 forks, or a few seconds' worth for --smoke.
func stateSize(smoke bool) (mb, forks, rounds int) {
	if smoke {
		return 8, 2, 2
	}
	return 100, 20, 5
}
