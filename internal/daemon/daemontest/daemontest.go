// Package daemontest starts a real cella daemon for tests: real runtime,
// real SQLite file, real templates from the machine's cache, served over real
// HTTP on loopback. Tests must run as root with bin/cella and bin/runsc built
// (make build, which also builds the agent that the daemons of tests run, as
// cella's do, into internal/agentbin); the base template is built once per
// machine if missing.
package daemontest

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/agentbin"
	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/rootfs"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/template"
)

// Env is one running daemon.
type Env struct {
	URL     string
	APIKey  string
	DataDir string
	Daemon  *daemon.Daemon
	Client  *client.Client
	Domain  string

	srv       *httptest.Server
	closeOnce sync.Once
}

// RepoRoot finds the module root from the test's working directory.
func RepoRoot(t testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if b, _ := os.ReadFile(filepath.Join(dir, "go.mod")); strings.Contains(string(b), "module github.com/cella-sandbox/cella\n") {
				return dir
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("cannot find the cella module root")
		}
		dir = parent
	}
}

// Binaries returns the cella and runsc binaries tests use.
func Binaries(t testing.TB) (cella, runsc string) {
	root := RepoRoot(t)
	cella = os.Getenv("CELLA_TEST_BIN")
	if cella == "" {
		cella = filepath.Join(root, "bin", "cella")
	}
	runsc = os.Getenv("CELLA_TEST_RUNSC")
	if runsc == "" {
		runsc = filepath.Join(root, "bin", "runsc")
	}
	for _, p := range []string{cella, runsc} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s is missing: run 'make build' first (%v)", p, err)
		}
	}
	return cella, runsc
}

// Agent is the agent binary cella embeds (internal/agentbin), which the
// daemons of tests run too.
func Agent(t testing.TB) []byte {
	b, err := agentbin.Binary()
	if err != nil {
		t.Fatalf("%v: run 'make build' first", err)
	}
	return b
}

// CacheDir is the template cache tests share with the rest of the machine.
func CacheDir() string {
	if d := os.Getenv("CELLA_CACHE_DIR"); d != "" {
		return d
	}
	return "/var/cache/cella"
}

var baseOnce sync.Once
var baseErr error

// EnsureBase builds the base template once per machine.
func EnsureBase(t testing.TB) {
	baseOnce.Do(func() {
		s, err := template.NewStore(CacheDir())
		if err != nil {
			baseErr = err
			return
		}
		_, baseErr = s.EnsureBase(context.Background(), io.Discard)
	})
	if baseErr != nil {
		t.Fatalf("base template: %v", baseErr)
	}
}

// Options tune Start.
type Options struct {
	DataDir string // reuse a data dir (restart tests); default: a new temp dir
	Log     io.Writer
	// Network is the daemon's egress configuration (default: networking on,
	// an empty ceiling: no egress).
	Network daemon.NetworkConfig
	// MetricsInterval is the resource sampling period (0: the default).
	MetricsInterval time.Duration
	// Maxima bound sandboxes' limits (zero fields: the host's).
	Maxima sandbox.Maxima
	// Build configures template builds (zero: the defaults).
	Build daemon.BuildConfig
	// AccessLog is the daemon's access log (daemon.Config.AccessLog).
	AccessLog string
	// Builder replaces the daemon's build engine (nil: the daemon's own).
	Builder build.Builder
	// Archive keeps paused sandboxes in an object store (--archive).
	Archive daemon.ArchiveConfig
	// Agent is the agent binary new sandboxes boot with (nil: the one
	// built into internal/agentbin, as cella's).
	Agent []byte
}

// Start runs a daemon with the given runtime until the test ends.
func Start(t testing.TB, runtimeName string, o Options) *Env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("cella tests run as root (they mount filesystems and start container runtimes)")
	}
	_, runsc := Binaries(t)
	agent := o.Agent
	if agent == nil {
		agent = Agent(t)
	}
	EnsureBase(t)
	dataDir := o.DataDir
	if dataDir == "" {
		var err error
		dataDir, err = os.MkdirTemp("", "cella-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// Runs after the daemon stopped (cleanups run last-in first-out):
			// whatever is still mounted under its data dir leaked.
			if left := MountsUnder(dataDir); len(left) > 0 {
				t.Errorf("the daemon left mounts behind: %v", left)
			}
			os.RemoveAll(dataDir)
		})
	}
	logw := o.Log
	if logw == nil {
		logw = &testLog{t: t}
	}
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelInfo}))
	d, err := daemon.New(context.Background(), daemon.Config{
		DataDir: dataDir, CacheDir: CacheDir(), Runtime: runtimeName, Domain: "cella.test",
		RunscPath: runsc, Agent: agent, Log: log, Network: o.Network, MetricsInterval: o.MetricsInterval, Maxima: o.Maxima,
		Build: o.Build, Builder: o.Builder, AccessLog: o.AccessLog, Archive: o.Archive,
	})
	if err != nil {
		t.Fatalf("start daemon: %v", err)
	}
	srv := httptest.NewServer(d.Handler)
	d.Serving(srv.Listener.Addr())
	key, err := os.ReadFile(d.AdminKeyPath)
	if err != nil {
		t.Fatal(err)
	}
	e := &Env{URL: srv.URL, APIKey: strings.TrimSpace(string(key)), DataDir: dataDir, Daemon: d, srv: srv, Domain: "cella.test"}
	e.Client, err = client.New(client.Config{URL: e.URL, APIKey: e.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// Close stops the daemon and every sandbox.
func (e *Env) Close() {
	e.closeOnce.Do(func() {
		e.srv.CloseClientConnections()
		e.srv.Close()
		e.Daemon.Close()
	})
}

// testLog sends daemon logs to the test log, quietly after the test ends.
type testLog struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	defer func() { _ = recover() }() // logging after the test ended panics
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// MountsUnder lists the mount points at or below dir.
func MountsUnder(dir string) []string {
	out, _ := rootfs.FindMounts(dir)
	return out
}
