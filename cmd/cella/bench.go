package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/bench"
)

func newBenchCmd() *cobra.Command {
	var cfg bench.Config
	var runtimes string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure cella against baselines taken in the same run (runs local daemons; needs root)",
	}
	create := &cobra.Command{
		Use:   "create",
		Short: "create→first-exec latency p50/p95/p99 per runtime, beside raw runsc/crun runs and fork+exec",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			self, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.CellaBinary = self
			if cfg.RunscPath == "" {
				if cfg.RunscPath, err = findRunsc(self); err != nil {
					return err
				}
			}
			if runtimes != "" {
				cfg.Runtimes = strings.Split(runtimes, ",")
			}
			figs, err := bench.Create(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if !cfg.JSON {
				fmt.Printf("cella bench create: n=%d per figure, baselines measured in the same run\n", cfg.N)
			}
			return bench.Print(os.Stdout, figs, cfg.JSON)
		},
	}
	f := cmd.PersistentFlags()
	f.IntVar(&cfg.N, "n", 20, "iterations per figure")
	f.StringVar(&runtimes, "runtimes", "gvisor,namespaces", "runtimes to measure")
	f.StringVar(&cfg.RunscPath, "runsc", envOr("CELLA_RUNSC", ""), "runsc binary (default: next to cella)")
	f.StringVar(&cfg.CacheDir, "cache-dir", envOr("CELLA_CACHE_DIR", "/var/cache/cella"), "template cache")
	f.BoolVar(&cfg.JSON, "json", false, "print JSON")
	cmd.AddCommand(create)
	return cmd
}
