package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/agentbin"
	"github.com/cella-sandbox/cella/internal/bench"
)

// benchFlags are shared by every `cella bench` subcommand.
type benchFlags struct {
	cfg      bench.Config
	runtimes string
	smoke    bool
	density  int
	burst    int
	egress   int
}

// prepare fills in the binaries and runtimes; a smoke run keeps every
// sub-benchmark to a few seconds (CI runs it to keep the code working).
func (b *benchFlags) prepare() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	b.cfg.CellaBinary = self
	if b.cfg.Agent, err = agentbin.Binary(); err != nil {
		return err
	}
	if b.cfg.RunscPath == "" {
		if b.cfg.RunscPath, err = findRunsc(self); err != nil {
			return err
		}
	}
	if b.runtimes != "" {
		b.cfg.Runtimes = strings.Split(b.runtimes, ",")
	}
	if b.smoke {
		b.cfg.N, b.density, b.burst, b.egress = 3, 5, 5, 20
	}
	return nil
}

func newBenchCmd() *cobra.Command {
	var b benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure cella against baselines taken in the same run (starts local daemons; needs root)",
	}
	sub := func(use, short string, run func(ctx context.Context) ([]bench.Figure, error)) *cobra.Command {
		return &cobra.Command{
			Use: use, Short: short, Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if err := b.prepare(); err != nil {
					return err
				}
				// An interrupt ends the bench through its context, so its
				// daemons stop their sandboxes and remove what they made
				// before it exits (the default SIGINT exit left them).
				ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				figs, err := run(ctx)
				if err != nil {
					return err
				}
				if !b.cfg.JSON {
					fmt.Printf("cella bench %s: baselines measured in the same run\n", use)
				}
				return bench.Print(os.Stdout, figs, b.cfg.JSON)
			},
		}
	}
	benches := []*cobra.Command{
		sub("create", "create→first-exec latency per runtime, beside raw runsc/crun runs and fork+exec",
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Create(ctx, b.cfg) }),
		sub("burst", "concurrent creates: p50/p95 and creates/s, beside a single cold create",
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Burst(ctx, b.cfg, b.burst) }),
		sub("exec", "round trip of `true` in a running sandbox, beside a local fork+exec",
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Exec(ctx, b.cfg) }),
		sub("density", "idle host memory per sandbox and API latency while many sandboxes idle",
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Density(ctx, b.cfg, b.density) }),
		sub("files", "upload/download of 1 MB and 1 GB through the API, beside a local copy",
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Files(ctx, b.cfg, b.smoke) }),
		sub("egress", "1000 small HTTP and 1000 HTTPS requests through the egress proxy, beside the same requests without it",
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Egress(ctx, b.cfg, b.egress) }),
		sub("docker", "the docker template beside base: create → first exec, create → docker info answers, docker run --rm beside an exec, idle memory",
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Docker(ctx, b.cfg) }),
		sub("template", "pull of a 5-layer image from a local registry (cold, then cached), create from it beside create from base, a template build, its cached rebuild, and create from a start-command snapshot",
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Template(ctx, b.cfg) }),
	}
	all := sub("all", "every sub-benchmark in turn", func(ctx context.Context) ([]bench.Figure, error) {
		var figs []bench.Figure
		for _, f := range []func(context.Context) ([]bench.Figure, error){
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Create(ctx, b.cfg) },
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Burst(ctx, b.cfg, b.burst) },
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Exec(ctx, b.cfg) },
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Density(ctx, b.cfg, b.density) },
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Files(ctx, b.cfg, b.smoke) },
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Egress(ctx, b.cfg, b.egress) },
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Template(ctx, b.cfg) },
			func(ctx context.Context) ([]bench.Figure, error) { return bench.Docker(ctx, b.cfg) },
			func(ctx context.Context) ([]bench.Figure, error) {
				// State under gVisor, beside its raw runsc floors (bench_state.go).
				if !slices.Contains(b.cfg.Runtimes, "gvisor") {
					return nil, nil
				}
				cfg := b.cfg
				cfg.Runtimes = []string{"gvisor"}
				mb, forks, rounds := stateSize(b.smoke)
				rs, err := bench.State(ctx, cfg, mb, forks, rounds)
				return bench.StateFigures(rs), err
			},
		} {
			got, err := f(ctx)
			if err != nil {
				return figs, err
			}
			figs = append(figs, got...)
		}
		return figs, nil
	})
	cmd.AddCommand(append(benches, all)...)
	cmd.AddCommand(newBenchStateCmd(&b))   // bench_state.go
	cmd.AddCommand(newBenchDesktopCmd(&b)) // bench_desktop.go
	cmd.AddCommand(newBenchSoakCmd(&b))    // bench_soak.go
	cmd.AddCommand(newBenchClusterCmd(&b)) // bench_cluster.go
	f := cmd.PersistentFlags()
	f.IntVar(&b.cfg.N, "n", 20, "iterations per figure")
	f.StringVar(&b.runtimes, "runtimes", "gvisor,namespaces", "runtimes to measure")
	f.StringVar(&b.cfg.RunscPath, "runsc", envOr("CELLA_RUNSC", ""), "runsc binary (default: next to cella)")
	f.StringVar(&b.cfg.CacheDir, "cache-dir", envOr("CELLA_CACHE_DIR", "/var/cache/cella"), "template cache")
	f.BoolVar(&b.cfg.JSON, "json", false, "print JSON")
	f.BoolVar(&b.smoke, "smoke", false, "a few seconds per sub-benchmark (checks that they run, not a measurement)")
	f.IntVar(&b.density, "sandboxes", 200, "idle sandboxes for density")
	f.IntVar(&b.burst, "concurrent", 50, "concurrent creates for burst")
	f.IntVar(&b.egress, "requests", 1000, "HTTP requests for egress")
	return cmd
}
