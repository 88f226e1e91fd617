package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/bench"
)

// newBenchDesktopCmd is `cella bench desktop`: the desktop template
// (computer use) beside base, under gVisor.
func newBenchDesktopCmd(b *benchFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "desktop",
		Short: "desktop template: create → first screenshot, screenshot round trip, create call and idle memory beside base (gVisor; builds the template on first use)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := b.prepare(); err != nil {
				return err
			}
			if b.smoke {
				b.cfg.N = 1
			} else if !cmd.Flags().Changed("n") {
				b.cfg.N = 5 // a desktop create takes seconds
			}
			b.cfg.Out = os.Stderr
			figs, err := bench.Desktop(cmd.Context(), b.cfg)
			if err != nil {
				return err
			}
			if !b.cfg.JSON {
				fmt.Println("cella bench desktop: base measured in the same run (gVisor)")
			}
			return bench.Print(os.Stdout, figs, b.cfg.JSON)
		},
	}
}
