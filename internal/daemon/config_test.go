package daemon

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/sandbox"
)

// TestNewValidatesFirst: every bad value stops New before it makes
// anything (no data dir, no probe), with an error naming the field. The
// network values were checked only after the runtime probe before.
func TestNewValidatesFirst(t *testing.T) {
	for field, bad := range map[string]func(*Config){
		"runtime":          func(c *Config) { c.Runtime = "docker" },
		"cache-dir":        func(c *Config) { c.CacheDir = "cache" },
		"runsc":            func(c *Config) { c.Runtime, c.RunscPath = runtime.GVisor, "/bin/true" }, // dynamically linked
		"mcp-max-calls":    func(c *Config) { c.MCPMaxCalls = -1 },
		"metrics-interval": func(c *Config) { c.MetricsInterval = time.Millisecond },
		"auto-archive":     func(c *Config) { c.Lifecycle.AutoArchive = -time.Second },
		"pool":             func(c *Config) { c.Pools = map[string]int{"base": sandbox.MaxPoolSize + 1} },
		"egress-allow":     func(c *Config) { c.Network.Allow = []string{"169.254.169.254"} },
		"egress-deny":      func(c *Config) { c.Network.Deny = []string{"not a name"} },
		"egress-resolve":   func(c *Config) { c.Network.Resolve = []string{"a.test"} },
		"egress-ca-file":   func(c *Config) { c.Network.UpstreamCAFile = "/nonexistent/ca.pem" },
		"egress-max-conns": func(c *Config) { c.Network.MaxConnsPerSandbox = -1 },
		"network-pool":     func(c *Config) { c.Network.PoolSize = -1 },
		"network-prefix":   func(c *Config) { c.Network.Prefix = netip.MustParsePrefix("10.0.0.0/31") },
	} {
		dataDir := filepath.Join(t.TempDir(), "data")
		c := Config{DataDir: dataDir, CacheDir: t.TempDir(), Runtime: runtime.Namespaces, Domain: "cella.test", Agent: []byte("an agent")}
		bad(&c)
		d, err := New(context.Background(), c)
		if err == nil {
			d.Close() // the test failed; leave nothing behind
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: %v, want a FieldError of %s", field, err, field)
		}
		if _, err := os.Stat(dataDir); err == nil {
			t.Errorf("%s: New made the data dir", field)
		}
	}
}
