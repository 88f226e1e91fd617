package bench

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
)

// local is a daemon started by a benchmark on a fresh data dir, served on
// loopback, with a client holding its admin key.
type local struct {
	Daemon *daemon.Daemon
	Client *client.Client
	URL    string

	srv     *http.Server
	dataDir string
}

func startLocal(ctx context.Context, cfg Config, rt string) (*local, error) {
	return startLocalNet(ctx, cfg, rt, daemon.NetworkConfig{})
}

// startLocalNet starts a daemon with an egress configuration.
func startLocalNet(ctx context.Context, cfg Config, rt string, nc daemon.NetworkConfig) (*local, error) {
	dataDir, err := os.MkdirTemp("", "cella-bench-")
	if err != nil {
		return nil, err
	}
	l := &local{dataDir: dataDir}
	d, err := daemon.New(ctx, daemon.Config{
		DataDir: dataDir, CacheDir: cfg.CacheDir, Runtime: rt, Domain: "bench.local",
		RunscPath: cfg.RunscPath, Agent: cfg.Agent, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Network: nc,
	})
	if err != nil {
		os.RemoveAll(dataDir)
		return nil, err
	}
	l.Daemon = d
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		l.Close()
		return nil, err
	}
	l.srv = &http.Server{Handler: d.Handler}
	d.Serving(ln.Addr())
	go l.srv.Serve(ln)
	l.URL = "http://" + ln.Addr().String()
	key, err := os.ReadFile(d.AdminKeyPath)
	if err != nil {
		l.Close()
		return nil, err
	}
	if l.Client, err = client.New(client.Config{URL: l.URL, APIKey: strings.TrimSpace(string(key))}); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Close stops every sandbox, the daemon and the server, and removes the data dir.
func (l *local) Close() {
	if l.srv != nil {
		l.srv.Close()
	}
	if l.Daemon != nil {
		l.Daemon.Close()
	}
	os.RemoveAll(l.dataDir)
}

// sandbox creates a sandbox on the daemon and attaches to its agent.
func (l *local) sandbox(ctx context.Context, req client.CreateRequest) (*client.SandboxConn, error) {
	sb, err := l.Client.Create(ctx, req)
	if err != nil {
		return nil, err
	}
	return l.Client.Sandbox(ctx, sb.SandboxID)
}
