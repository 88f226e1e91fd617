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

	"github.com/cella-sandbox/cella/internal/agentbin"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/runtime"
)

func newServeCmd() *cobra.Command {
	var c serveConfig
	var set *settings
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the cella daemon",
		Long: `Run the cella daemon. Every flag is also a CELLA_* variable (in brackets):
a flag wins over its variable, a variable over the default. Every value is
checked before anything starts; a bad one stops cella serve with its name.`,
		Args:        cobra.NoArgs,
		Annotations: map[string]string{errorPrefix: "cella serve"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := set.resolve(); err != nil { // serveconfig.go
				return err
			}
			return serve(cmd.Context(), c, set)
		},
	}
	set = register(cmd.Flags(), serveSettings(&c)...)
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

// serve runs the daemon until SIGTERM or SIGINT. Its settings are
// resolved; the whole config is validated before anything starts.
func serve(ctx context.Context, c serveConfig, set *settings) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: c.LogLevel}))
	slog.SetDefault(log)
	c.Log = log
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary: %w", err)
	}
	if c.Agent, err = agentbin.Binary(); err != nil {
		return err
	}
	if c.Runtime == runtime.GVisor && c.RunscPath == "" {
		if c.RunscPath, err = findRunsc(self); err != nil {
			return err
		}
	}
	if c.Cluster.Kubeconfig != "" && c.Cluster.Endpoint == "" {
		c.Cluster.Endpoint = "http://" + c.Listen
	}
	// daemon.New validates again, but only here can a bad value be named
	// by the flag or variable it came from.
	if err := c.Validate(); err != nil {
		return set.name(err)
	}
	if os.Geteuid() != 0 {
		return errors.New("cella serve must run as root: it mounts root filesystems and drives container runtimes")
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
	defer d.Close() // logs every closer that fails, by name
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
