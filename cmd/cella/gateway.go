package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/gateway"
)

// gatewayConfig is what `cella gateway` runs with.
type gatewayConfig struct {
	Kubeconfig, Namespace, Listen, Domain string
	LogLevel                              slog.Level
}

func gatewaySettings(c *gatewayConfig) []*setting {
	return []*setting{
		{flag: "cluster", env: "CELLA_CLUSTER", def: cluster.InCluster, kind: "path", apply: one(&c.Kubeconfig, text),
			usage: "the cluster's Kubernetes API: a kubeconfig file, or in-cluster (the pod's service account)"},
		clusterNamespaceSetting(&c.Namespace),
		{flag: "listen", env: "CELLA_LISTEN", def: "127.0.0.1:3000", kind: "host:port", apply: one(&c.Listen, hostPort),
			usage: "address of the cluster's API and sandbox proxy"},
		{flag: "domain", env: "CELLA_DOMAIN", def: "localhost", kind: "domain", apply: one(&c.Domain, text),
			usage: "domain of sandbox hosts, PORT-ID.DOMAIN: the nodes' --domain"},
		logLevelSetting(&c.LogLevel),
	}
}

func newGatewayCmd() *cobra.Command {
	var c gatewayConfig
	var set *settings
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run a cluster's gateway: one E2B endpoint over every cella serve --cluster node",
		Long: `Run a gateway of a cella cluster: it places each create on the live node
with the most room (nodes are their Leases in the cluster's namespace) and
forwards every request for a sandbox, REST and sandbox traffic, to its node.
It keeps no state: run as many as you like.`,
		Args:        cobra.NoArgs,
		Annotations: map[string]string{errorPrefix: "cella gateway"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := set.resolve(); err != nil {
				return err
			}
			return runGateway(cmd.Context(), c)
		},
	}
	set = register(cmd.Flags(), gatewaySettings(&c)...)
	return cmd
}

func runGateway(ctx context.Context, c gatewayConfig) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: c.LogLevel}))
	slog.SetDefault(log)
	cl, err := cluster.Connect(c.Kubeconfig)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.Listen, err)
	}
	defer ln.Close()
	g := gateway.New(gateway.Config{Client: cl, Namespace: c.Namespace, Domain: c.Domain, Log: log})
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 640 * time.Second}
	log.Info("cella gateway serving", "listen", ln.Addr().String(), "namespace", c.Namespace, "domain", c.Domain)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-sigs:
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}
