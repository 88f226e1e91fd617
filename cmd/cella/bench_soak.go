package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/bench"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// newBenchSoakCmd is `cella bench soak` (make soak): agents × commands
// against a `cella serve` child, then a kill -9 of it mid-load; it fails
// on any error or leaked resource.
func newBenchSoakCmd(b *benchFlags) *cobra.Command {
	var sc bench.SoakConfig
	noCrash := false
	cmd := &cobra.Command{
		Use:   "soak",
		Short: "agents × commands (exec, files with checksums, curl through egress) on a `cella serve` child, then kill -9 of it mid-load and a restart; fails on any error or leak",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := b.prepare(); err != nil {
				return err
			}
			sc.Config = b.cfg
			sc.Crash = !noCrash
			if b.smoke {
				sc.Agents, sc.Commands, sc.MaxFile, sc.KillAfter = 3, 5, 256<<10, 6
			}
			if sc.Agents < 1 || sc.Commands < 1 {
				return fmt.Errorf("--agents and --commands must be at least 1")
			}
			sc.Progress = os.Stderr
			t0 := time.Now()
			rep, err := bench.Soak(cmd.Context(), sc)
			if err != nil {
				if rep != nil && rep.WorkDir != "" {
					return fmt.Errorf("%w (the daemon's log and data dir are in %s)", err, rep.WorkDir)
				}
				return err
			}
			if b.cfg.JSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				printSoak(rep, time.Since(t0))
			}
			if n := len(rep.Errors) + len(rep.Leaks); n > 0 {
				return fmt.Errorf("soak failed: %d errors, %d leaks (the daemon's log and data dir are in %s)", len(rep.Errors), len(rep.Leaks), rep.WorkDir)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&sc.Runtime, "runtime", runtime.GVisor, "runtime of the daemon: gvisor or namespaces")
	f.IntVar(&sc.Agents, "agents", 50, "concurrent agents, each with its own sandbox")
	f.IntVar(&sc.Commands, "commands", 100, "commands per agent")
	f.IntVar(&sc.KillAfter, "kill-after", 0, "commands completed before the daemon is killed in the crash phase (default: a quarter of the load)")
	f.IntVar(&sc.MaxFile, "max-file", 3<<20, "largest file an agent uploads, in bytes")
	f.BoolVar(&noCrash, "no-crash", false, "skip the crash phase")
	f.BoolVar(&sc.Keep, "keep", false, "keep the work dir (the daemon's data dir and log) even when the soak passes")
	return cmd
}

func printSoak(rep *bench.SoakReport, took time.Duration) {
	fmt.Printf("cella bench soak: %d agents × %d commands (%s), the idle baseline measured in the same run, %v in all\n",
		rep.Agents, rep.Commands, rep.Runtime, took.Round(time.Second))
	_ = bench.Print(os.Stdout, rep.Figures, false)
	fmt.Printf("load: %.1f commands/s\n", rep.CommandsPerSec)
	if c := rep.Crash; c != nil {
		fmt.Printf("crash: kill -9 after %d commands, restart answered in %v; %d sandboxes confirmed before the kill: %d adopted (exec works, %d files intact), %d dead with a reason\n",
			c.KilledAfter, c.Restart.Round(time.Millisecond), c.Confirmed, c.Adopted, c.Files, c.Dead)
		for _, r := range c.DeadReasons {
			fmt.Println("  dead:", r)
		}
	}
	for _, e := range rep.Errors {
		fmt.Println("error:", e)
	}
	for _, l := range rep.Leaks {
		fmt.Println("leak:", l)
	}
	if len(rep.Errors)+len(rep.Leaks) == 0 {
		fmt.Println("zero errors, nothing leaked")
	}
}
