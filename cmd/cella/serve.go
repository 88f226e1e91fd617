package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/sandbox"
)

// serveConfig is the daemon's command line; every flag also reads CELLA_*.
type serveConfig struct {
	daemon.Config
	Listen   string
	LogLevel string
	// envErr is a CELLA_MAX_* value that does not parse (maxflags.go).
	envErr   error
	registry registryFlags
}

func (c *serveConfig) Validate() error {
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("--listen %q: %w", c.Listen, err)
	}
	if c.envErr != nil {
		return c.envErr
	}
	var err error
	c.Registry, c.MaxLayerSize, err = c.registry.config()
	return err
}

func newServeCmd() *cobra.Command {
	var c serveConfig
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the cella daemon",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := c.Validate(); err != nil {
				return err
			}
			return serve(cmd.Context(), c)
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.DataDir, "data-dir", envOr("CELLA_DATA_DIR", "/var/lib/cella"), "state directory (SQLite, sandboxes, admin key) [CELLA_DATA_DIR]")
	f.StringVar(&c.CacheDir, "cache-dir", envOr("CELLA_CACHE_DIR", "/var/cache/cella"), "template cache shared across data dirs [CELLA_CACHE_DIR]")
	f.StringVar(&c.Listen, "listen", envOr("CELLA_LISTEN", "127.0.0.1:3000"), "address of the API and sandbox proxy [CELLA_LISTEN]")
	f.StringVar(&c.Runtime, "runtime", envOr("CELLA_RUNTIME", runtime.GVisor), "isolation runtime: gvisor or namespaces [CELLA_RUNTIME]")
	f.StringVar(&c.Domain, "domain", envOr("CELLA_DOMAIN", "localhost"), "domain of sandbox hosts <port>-<id>.<domain> [CELLA_DOMAIN]")
	f.StringVar(&c.RunscPath, "runsc", envOr("CELLA_RUNSC", ""), "path of runsc (default: next to the cella binary, then $PATH) [CELLA_RUNSC]")
	f.StringVar(&c.RunscDebugDir, "runsc-debug-dir", envOr("CELLA_RUNSC_DEBUG_DIR", ""), "write runsc debug logs here (diagnostics) [CELLA_RUNSC_DEBUG_DIR]")
	f.Int64Var(&c.MCPMaxCalls, "mcp-max-calls", envInt("CELLA_MCP_MAX_CALLS", 0), "tool calls each /mcp session may make, 0 = unlimited [CELLA_MCP_MAX_CALLS]")
	if err := registerLifecycleDefaults(f, &c.Lifecycle); err != nil { // lifecycleflags.go
		fmt.Fprintln(os.Stderr, "cella serve:", err)
	}
	registerNetworkFlags(f, &c.Network)   // netflags.go
	registerRegistryFlags(f, &c.registry) // registryflags.go: image pulls
	// --pool TEMPLATE=N: warm pools (pool.go)
	if err := registerPoolFlag(f, &c.Pools); err != nil {
		fmt.Fprintln(os.Stderr, "cella serve:", err)
	}
	// --max-cpus/memory/disk/pids: bounds of sandbox limits (maxflags.go)
	c.envErr = registerMaxFlags(f, &c.Maxima)
	c.AuditRetention = 7 * 24 * time.Hour
	if err := envLifeDuration("CELLA_AUDIT_RETENTION", &c.AuditRetention); err != nil { // lifecycleflags.go
		fmt.Fprintln(os.Stderr, "cella serve:", err)
	}
	f.Var(lifeDuration{&c.AuditRetention}, "audit-retention", "how long the audit log of a sandbox that is gone is kept, e.g. 7d or 12h [CELLA_AUDIT_RETENTION]")
	f.DurationVar(&c.MetricsInterval, "metrics-interval", envDuration("CELLA_METRICS_INTERVAL", sandbox.DefaultMetricsInterval), "how often each running sandbox's CPU, memory and disk use is sampled (GET /sandboxes/{id}/metrics keeps an hour) [CELLA_METRICS_INTERVAL]")
	f.StringVar(&c.LogLevel, "log-level", envOr("CELLA_LOG_LEVEL", "info"), "debug, info, warn or error [CELLA_LOG_LEVEL]")
	return cmd
}

// findRunsc looks for runsc next to the cella binary (make build puts both
// in bin/), then on $PATH.
func findRunsc(self string) (string, error) {
	next := filepath.Join(filepath.Dir(self), "runsc")
	if _, err := os.Stat(next); err == nil {
		return next, nil
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("runsc not found next to %s or on $PATH: build it with 'make build' or pass --runsc", self)
}

func serve(ctx context.Context, c serveConfig) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)
	c.Log = log
	if os.Geteuid() != 0 {
		return errors.New("cella serve must run as root: it mounts root filesystems and drives container runtimes")
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary: %w", err)
	}
	c.AgentBinary = self
	if c.Runtime == runtime.GVisor && c.RunscPath == "" {
		if c.RunscPath, err = findRunsc(self); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.Listen, err)
	}
	defer ln.Close()
	d, err := daemon.New(ctx, c.Config)
	if err != nil {
		return err
	}
	defer d.Close()
	d.Serving(ln.Addr())

	srv := &http.Server{Handler: d.Handler, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 640 * time.Second}
	log.Info("cella daemon serving", "listen", ln.Addr().String(), "runtime", c.Runtime, "domain", c.Domain, "data_dir", c.DataDir)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case sig := <-sigs:
		log.Info("shutting down: stopping every sandbox", "signal", sig.String())
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}
