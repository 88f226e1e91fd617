package main

import (
	"flag"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/layerstore"
	"github.com/cella-sandbox/cella/internal/network"
	"github.com/cella-sandbox/cella/internal/rootfs"
	"github.com/cella-sandbox/cella/internal/sandbox"
)

// clearServeEnv unsets (sets empty, which resolve treats alike) every
// variable of cella serve: make exports CELLA_DATA_DIR and CELLA_CACHE_DIR.
func clearServeEnv(t *testing.T) {
	for _, s := range serveSettings(&serveConfig{}) {
		t.Setenv(s.env, "")
	}
}

// resolveServe resolves cella serve's settings from args and the
// environment.
func resolveServe(t *testing.T, args ...string) (serveConfig, *settings, error) {
	t.Helper()
	var c serveConfig
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	set := register(fs, serveSettings(&c)...)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return c, set, set.resolve()
}

// TestServeDefaults: every default parses, into the values the packages
// that own them define.
func TestServeDefaults(t *testing.T) {
	clearServeEnv(t)
	c, _, err := resolveServe(t)
	if err != nil {
		t.Fatal(err)
	}
	for name, ok := range map[string]bool{
		"data dir":         c.DataDir == "/var/lib/cella" && c.CacheDir == "/var/cache/cella",
		"listen":           c.Listen == "127.0.0.1:3000" && c.Runtime == "gvisor" && c.Domain == "localhost" && c.RunscPath == "",
		"log level":        c.LogLevel == slog.LevelInfo,
		"lifecycle":        c.Lifecycle == sandbox.Lifecycle{},
		"audit retention":  c.AuditRetention == 7*24*time.Hour,
		"metrics interval": c.MetricsInterval == sandbox.DefaultMetricsInterval,
		"pools":            len(c.Pools) == 0,
		"network":          !c.Network.Disabled && c.Network.Allow == nil && c.Network.Resolve == nil,
		"max conns":        c.Network.MaxConnsPerSandbox == egress.DefaultMaxConnsPerSandbox,
		"prefix":           c.Network.Prefix == network.DefaultPrefix && c.Network.PoolSize == network.DefaultPoolSize,
		"maxima":           c.Maxima == sandbox.Maxima{},
		"registry":         c.Registry.Mirrors == nil && c.Registry.Insecure == nil,
		"max layer size":   c.MaxLayerSize == layerstore.DefaultMaxLayerSize,
	} {
		if !ok {
			t.Errorf("default %s: %+v", name, c)
		}
	}
}

// TestServeSettingsSources: a variable sets a field, a flag wins over it;
// lists are comma-separated in the variable and repeat on the command line.
func TestServeSettingsSources(t *testing.T) {
	clearServeEnv(t)
	t.Setenv("CELLA_NO_NETWORK", "1")
	t.Setenv("CELLA_EGRESS_ALLOW", "pypi.org, *.pythonhosted.org")
	t.Setenv("CELLA_EGRESS_RESOLVE", "a.test=127.0.0.1:8080,127.0.0.2")
	t.Setenv("CELLA_NETWORK_PREFIX", "10.9.0.0/29")
	t.Setenv("CELLA_MCP_MAX_CALLS", "7")
	t.Setenv("CELLA_METRICS_INTERVAL", "2s")
	t.Setenv("CELLA_LOG_LEVEL", "debug")
	t.Setenv("CELLA_REGISTRY_MIRROR", "docker.io=http://127.0.0.1:5000")
	t.Setenv("CELLA_MAX_LAYER_SIZE", "512M")
	c, _, err := resolveServe(t)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Network.Disabled || strings.Join(c.Network.Allow, " ") != "pypi.org *.pythonhosted.org" ||
		strings.Join(c.Network.Resolve, " ") != "a.test=127.0.0.1:8080 127.0.0.2" || c.Network.Prefix.String() != "10.9.0.0/29" ||
		c.MCPMaxCalls != 7 || c.MetricsInterval != 2*time.Second || c.LogLevel != slog.LevelDebug ||
		strings.Join(c.Registry.Mirrors["docker.io"], " ") != "http://127.0.0.1:5000" || c.MaxLayerSize != 512<<20 {
		t.Fatalf("from the environment: %+v", c)
	}
	c, _, err = resolveServe(t, "--no-network=false", "--egress-allow", "github.com", "--egress-allow", "a.test,b.test", "--metrics-interval", "1s", "--log-level", "warn")
	if err != nil {
		t.Fatal(err)
	}
	if c.Network.Disabled || strings.Join(c.Network.Allow, " ") != "github.com a.test b.test" || c.MetricsInterval != time.Second || c.LogLevel != slog.LevelWarn {
		t.Fatalf("flags over the environment: %+v", c)
	}
	if c, _, err = resolveServe(t, "--no-network"); err != nil || !c.Network.Disabled {
		t.Fatalf("--no-network alone: %v, %v", c.Network.Disabled, err)
	}
}

// TestServeBadValues: a value that does not parse is an error naming the
// flag or the variable it came from, never a silent fallback to the
// default. (CELLA_NO_NETWORK=yes read as false, CELLA_EGRESS_MAX_CONNS,
// CELLA_NETWORK_POOL, CELLA_MCP_MAX_CALLS and CELLA_METRICS_INTERVAL fell
// back to their defaults before.)
func TestServeBadValues(t *testing.T) {
	for _, tc := range []struct{ env, value, want string }{
		{"CELLA_NO_NETWORK", "yes", `CELLA_NO_NETWORK: "yes" is not a boolean (want true or false)`},
		{"CELLA_POOL", "base=x", `CELLA_POOL: "base=x": want TEMPLATE=N, e.g. base=2`},
		{"CELLA_EGRESS_MAX_CONNS", "many", `CELLA_EGRESS_MAX_CONNS: "many" is not a whole number`},
		{"CELLA_EGRESS_MAX_CONNS", "-1", `CELLA_EGRESS_MAX_CONNS: "-1": want 0 or more`},
		{"CELLA_NETWORK_POOL", "four", `CELLA_NETWORK_POOL: "four" is not a whole number`},
		{"CELLA_MCP_MAX_CALLS", "1e3", `CELLA_MCP_MAX_CALLS: "1e3" is not a whole number`},
		{"CELLA_METRICS_INTERVAL", "often", `CELLA_METRICS_INTERVAL: time: invalid duration "often"`},
		{"CELLA_NETWORK_PREFIX", "10.200.0.0", `CELLA_NETWORK_PREFIX: "10.200.0.0": want an IPv4 prefix, e.g. 10.200.0.0/30`},
		{"CELLA_LISTEN", "3000", `CELLA_LISTEN: "3000": want HOST:PORT, e.g. 127.0.0.1:3000`},
		{"CELLA_LOG_LEVEL", "loud", `CELLA_LOG_LEVEL: "loud": want debug, info, warn or error`},
		{"CELLA_AUTO_STOP", "soon", `CELLA_AUTO_STOP: invalid duration "soon" (use e.g. 30s, 15m, 12h or 7d)`},
		{"CELLA_MAX_CPUS", "NaN", `CELLA_MAX_CPUS: invalid CPU count "NaN" (use e.g. 8 or 0.5; 0 = the host's cores)`},
		{"CELLA_MAX_MEMORY", "lots", `CELLA_MAX_MEMORY: invalid size "lots" (use e.g. 512M or 2G)`},
		{"CELLA_MAX_LAYER_SIZE", "8T", `CELLA_MAX_LAYER_SIZE: invalid size "8T" (use e.g. 512M or 2G)`},
		{"CELLA_REGISTRY_MIRROR", "docker.io", `CELLA_REGISTRY_MIRROR: registry mirror "docker.io": want REGISTRY=URL, e.g. docker.io=http://127.0.0.1:5000`},
	} {
		clearServeEnv(t)
		t.Setenv(tc.env, tc.value)
		if _, _, err := resolveServe(t); err == nil || err.Error() != tc.want {
			t.Errorf("%s=%s: %v\nwant %s", tc.env, tc.value, err, tc.want)
		}
	}
	clearServeEnv(t)
	for _, tc := range []struct{ args, want string }{
		{"--pool base=x", `--pool: "base=x": want TEMPLATE=N, e.g. base=2`},
		{"--no-network=yes", `--no-network: "yes" is not a boolean (want true or false)`},
		{"--max-pids -5", `--max-pids: "-5": want 0 or more`},
		{"--max-memory 9007199254740993G", `--max-memory: invalid size "9007199254740993G" (use e.g. 512M or 2G)`},
	} {
		if _, _, err := resolveServe(t, strings.Fields(tc.args)...); err == nil || err.Error() != tc.want {
			t.Errorf("%s: %v\nwant %s", tc.args, err, tc.want)
		}
	}
}

// TestServeValidateNamesSource: what daemon.Config.Validate refuses (a range,
// a value the egress package rejects, a missing file) is named by the flag
// or variable it came from too.
func TestServeValidateNamesSource(t *testing.T) {
	validate := func(args ...string) string {
		c, set, err := resolveServe(t, append([]string{"--runtime", "namespaces"}, args...)...)
		if err != nil {
			return err.Error() // refused before Validate: as good
		}
		c.Agent = []byte("an agent")
		if err := c.Validate(); err != nil {
			return set.name(err).Error()
		}
		return ""
	}
	clearServeEnv(t)
	t.Setenv("CELLA_METRICS_INTERVAL", "10ms")
	if got, want := validate(), "CELLA_METRICS_INTERVAL: 10ms is out of range (100ms to 1h0m0s)"; got != want {
		t.Errorf("CELLA_METRICS_INTERVAL=10ms: %s, want %s", got, want)
	}
	if got, want := validate("--metrics-interval", "2h"), "--metrics-interval: 2h0m0s is out of range (100ms to 1h0m0s)"; got != want {
		t.Errorf("--metrics-interval 2h: %s, want %s", got, want)
	}
	clearServeEnv(t)
	for _, tc := range []struct{ env, value, want string }{
		{"CELLA_NETWORK_PREFIX", "10.0.0.0/31", "CELLA_NETWORK_PREFIX: network config: prefix 10.0.0.0/31 is smaller than /30 (needs two host addresses)"},
		{"CELLA_EGRESS_RESOLVE", "nothing", `CELLA_EGRESS_RESOLVE: "nothing": want NAME=ADDRESS[:PORT][,ADDRESS[:PORT]...]`},
		{"CELLA_EGRESS_CA_FILE", "/nonexistent/ca.pem", "CELLA_EGRESS_CA_FILE: open /nonexistent/ca.pem: no such file or directory"},
		{"CELLA_EGRESS_ALLOW", "169.254.169.254", "CELLA_EGRESS_ALLOW: "},
		{"CELLA_DATA_DIR", "relative", `CELLA_DATA_DIR: "relative" is not an absolute path`},
		{"CELLA_AUTO_DELETE", "4000d", "CELLA_AUTO_DELETE: 96000h0m0s is out of range (0 to 10 years)"},
		{"CELLA_POOL", "base=65", `CELLA_POOL: "base=65": the size must be between 0 and 64`},
	} {
		t.Setenv(tc.env, tc.value)
		if got := validate(); !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s=%s: %q, want %q", tc.env, tc.value, got, tc.want)
		}
		t.Setenv(tc.env, "")
	}
}

// TestPoolFlag: --pool TEMPLATE=N repeats and takes lists, and replaces
// what CELLA_POOL gave.
func TestPoolFlag(t *testing.T) {
	clearServeEnv(t)
	t.Setenv("CELLA_POOL", "base=1, code-interpreter-v1=2")
	c, _, err := resolveServe(t)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"base": 1, "code-interpreter-v1": 2}; !maps.Equal(c.Pools, want) {
		t.Fatalf("from CELLA_POOL: %v, want %v", c.Pools, want)
	}
	if c, _, err = resolveServe(t, "--pool", "base=3", "--pool", "py=0,node=1"); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"base": 3, "py": 0, "node": 1}; !maps.Equal(c.Pools, want) {
		t.Fatalf("from --pool: %v, want %v", c.Pools, want)
	}
	for _, bad := range []string{"base", "base=x", "=2", "base=-1", "base=1000"} {
		if err := parsePoolSizes(bad, map[string]int{}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestEnvLifeDuration: a set variable of a life-duration setting is read
// with parseLifeDuration; a bad one is an error naming it that leaves the
// field as it was.
func TestEnvLifeDuration(t *testing.T) {
	const env = "CELLA_TEST_LIFE_DURATION"
	d := time.Hour
	set := register(pflag.NewFlagSet("t", pflag.ContinueOnError),
		&setting{flag: "life", env: env, def: "1h", kind: "duration", apply: one(&d, parseLifeDuration)})
	for v, want := range map[string]time.Duration{"": time.Hour, "0": 0, "90s": 90 * time.Second, "7d": 7 * 24 * time.Hour, "0.5d": 12 * time.Hour} {
		t.Setenv(env, v)
		if err := set.resolve(); err != nil || d != want {
			t.Errorf("%s=%q: %v, %v; want %v", env, v, d, err, want)
		}
	}
	for _, v := range []string{"soon", "-1h", "-2d", "1x"} {
		t.Setenv(env, v)
		d = time.Hour
		err := set.resolve()
		if want := env + `: invalid duration "` + v + `" (use e.g. 30s, 15m, 12h or 7d)`; err == nil || err.Error() != want || d != time.Hour {
			t.Errorf("%s=%q: %v, %v; want the field unchanged and %q", env, v, d, err, want)
		}
	}
}

// TestServeAuditRetention: --audit-retention defaults to 7 days, or to
// CELLA_AUDIT_RETENTION; a bad value stops serve (it was ignored).
func TestServeAuditRetention(t *testing.T) {
	clearServeEnv(t)
	for v, want := range map[string]time.Duration{"": 7 * 24 * time.Hour, "12h": 12 * time.Hour, "2d": 48 * time.Hour, "0": 0} {
		t.Setenv("CELLA_AUDIT_RETENTION", v)
		if c, _, err := resolveServe(t); err != nil || c.AuditRetention != want {
			t.Errorf("CELLA_AUDIT_RETENTION=%q: %v, %v; want %v", v, c.AuditRetention, err, want)
		}
	}
	t.Setenv("CELLA_AUDIT_RETENTION", "bad")
	if _, _, err := resolveServe(t); err == nil || !strings.HasPrefix(err.Error(), "CELLA_AUDIT_RETENTION: ") {
		t.Errorf("CELLA_AUDIT_RETENTION=bad: %v", err)
	}
}

// TestMaxFlags: the maxima come from CELLA_MAX_* and the flags (sizes like
// 16G); a value that does not parse, or a size that would overflow, is an
// error naming it, and serve refuses to start with it.
func TestMaxFlags(t *testing.T) {
	clearServeEnv(t)
	t.Setenv("CELLA_MAX_CPUS", "1.5")
	t.Setenv("CELLA_MAX_MEMORY", "16G")
	t.Setenv("CELLA_MAX_DISK", "2048")
	t.Setenv("CELLA_MAX_PIDS", "4096")
	c, _, err := resolveServe(t)
	if err != nil {
		t.Fatal(err)
	}
	if want := (sandbox.Maxima{CPUs: 1.5, MemoryMB: 16384, DiskMB: 2048, Pids: 4096}); c.Maxima != want {
		t.Fatalf("from the environment: %+v, want %+v", c.Maxima, want)
	}
	if c, _, err = resolveServe(t, "--max-memory", "512M", "--max-disk", "0", "--max-cpus", "8"); err != nil {
		t.Fatal(err)
	}
	if want := (sandbox.Maxima{CPUs: 8, MemoryMB: 512, DiskMB: 0, Pids: 4096}); c.Maxima != want {
		t.Fatalf("flags over the environment: %+v, want %+v", c.Maxima, want)
	}
	for _, bad := range []string{"--max-memory=9007199254740993G", "--max-memory=lots", "--max-cpus=NaN", "--max-cpus=-1", "--max-pids=-5"} {
		if _, _, err := resolveServe(t, bad); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
	t.Setenv("CELLA_MAX_PIDS", "many")
	if _, _, err := resolveServe(t); err == nil || !strings.Contains(err.Error(), "CELLA_MAX_PIDS") {
		t.Fatalf("a bad CELLA_MAX_PIDS: %v", err)
	}
	cmd := newServeCmd()
	if err := cmd.RunE(cmd, nil); err == nil || !strings.Contains(err.Error(), "CELLA_MAX_PIDS") {
		t.Fatalf("serve with a bad CELLA_MAX_PIDS: %v", err)
	}
}

var updateReadme = flag.Bool("update-readme", false, "rewrite the README's Configuration table from serveSettings")

// TestReadmeConfiguration: the README's table of cella serve's settings is
// serveSettings, rendered: every flag, variable, default and doc. Run
// `go test ./cmd/cella -run TestReadmeConfiguration -update-readme` after
// changing a setting.
func TestReadmeConfiguration(t *testing.T) {
	const begin, end = "<!-- serve settings: generated from cmd/cella/serveconfig.go by TestReadmeConfiguration -update-readme -->\n", "<!-- end of serve settings -->\n"
	path := filepath.Join(daemontest.RepoRoot(t), "README.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i, j := strings.Index(readme, begin), strings.Index(readme, end)
	if i < 0 || j < i {
		t.Fatalf("README.md has no %q ... %q section", begin, end)
	}
	got, want := readme[i+len(begin):j], readmeTable(serveSettings(&serveConfig{}))
	if got == want {
		return
	}
	if *updateReadme {
		if err := os.WriteFile(path, []byte(readme[:i+len(begin)]+want+readme[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	gotRows, wantRows := strings.Split(got, "\n"), strings.Split(want, "\n")
	for k := 0; k < max(len(gotRows), len(wantRows)); k++ {
		var g, w string
		if k < len(gotRows) {
			g = gotRows[k]
		}
		if k < len(wantRows) {
			w = wantRows[k]
		}
		if g != w {
			t.Errorf("README row %d:\n  is        %s\n  should be %s", k+1, g, w)
		}
	}
	t.Error("the README's Configuration table and serveSettings disagree: go test ./cmd/cella -run TestReadmeConfiguration -update-readme")
}

// TestServeRefusesBadConfigAtOnce: a bad value, as a variable or a flag,
// stops a real `cella serve` before anything starts: it exits non-zero
// with the value's name, has probed no runtime and made no data dir.
// (Values parsed after the 60 s probe before, or silently replaced by
// their defaults, started the daemon.)
func TestServeRefusesBadConfigAtOnce(t *testing.T) {
	bin, runsc := daemontest.Binaries(t)
	for _, tc := range []struct {
		env  string // NAME=VALUE
		args []string
		want string
	}{
		{env: "CELLA_NO_NETWORK=yes", want: `cella serve: CELLA_NO_NETWORK: "yes" is not a boolean`},
		{env: "CELLA_POOL=base=x", want: `cella serve: CELLA_POOL: "base=x": want TEMPLATE=N`},
		{args: []string{"--pool", "base=x"}, want: `cella serve: --pool: "base=x": want TEMPLATE=N`},
		{env: "CELLA_METRICS_INTERVAL=10ms", want: "cella serve: CELLA_METRICS_INTERVAL: 10ms is out of range"},
		{env: "CELLA_NETWORK_PREFIX=10.0.0.0/31", want: "cella serve: CELLA_NETWORK_PREFIX: network config: prefix 10.0.0.0/31 is smaller than /30"},
		{env: "CELLA_EGRESS_RESOLVE=nothing", want: `cella serve: CELLA_EGRESS_RESOLVE: "nothing": want NAME=ADDRESS`},
		{env: "CELLA_EGRESS_CA_FILE=/nonexistent/ca.pem", want: "cella serve: CELLA_EGRESS_CA_FILE: open /nonexistent/ca.pem"},
		{env: "CELLA_EGRESS_MAX_CONNS=many", want: `cella serve: CELLA_EGRESS_MAX_CONNS: "many" is not a whole number`},
		{env: "CELLA_AUDIT_RETENTION=bad", want: `cella serve: CELLA_AUDIT_RETENTION: invalid duration "bad"`},
		{env: "CELLA_RUNSC=/bin/true", want: "cella serve: CELLA_RUNSC: gvisor: /bin/true is dynamically linked"},
		{args: []string{"--node-name", "n1"}, want: "cella serve: --node-name: \"n1\": needs --cluster"},
		{args: []string{"--cluster", "/nonexistent/kubeconfig"}, want: "cella serve: --node-name: required with --cluster"},
		{args: []string{"--cluster", "/nonexistent/kubeconfig", "--node-name", "Bad_Name"}, want: "cella serve: --node-name: node name \"Bad_Name\": want 1-42 characters"},
		{args: []string{"--cluster", "/nonexistent/kubeconfig", "--node-name", "n1", "--advertise-url", "http://0.0.0.0:3000"}, want: "cella serve: --advertise-url: \"http://0.0.0.0:3000\": want the http(s)://HOST:PORT"},
		{env: "CELLA_LEASE_DURATION=1s", args: []string{"--cluster", "/nonexistent/kubeconfig", "--node-name", "n1"}, want: "cella serve: CELLA_LEASE_DURATION: 1s is out of range (3s to 10m)"},
		{args: []string{"--template-registry", "127.0.0.1:5000/cella"}, want: "cella serve: --template-registry: \"127.0.0.1:5000/cella\": needs --cluster"},
		{args: []string{"--cluster", "/nonexistent/kubeconfig", "--node-name", "n1", "--template-registry", "http://127.0.0.1:5000/cella"}, want: "cella serve: --template-registry: \"http://127.0.0.1:5000/cella\": want HOST[:PORT]/PREFIX"},
		{args: []string{"--cluster", "/nonexistent/kubeconfig", "--node-name", "n1", "--template-registry", "127.0.0.1:5000/cella:v1"}, want: "cella serve: --template-registry: \"127.0.0.1:5000/cella:v1\": want HOST[:PORT]/PREFIX"},
	} {
		name := tc.env
		if name == "" {
			name = strings.Join(tc.args, " ")
		}
		t.Run(name, func(t *testing.T) {
			dataDir := filepath.Join(t.TempDir(), "data") // must not come to exist
			args := append([]string{"serve", "--listen", freePort(t), "--data-dir", dataDir, "--cache-dir", daemontest.CacheDir()}, tc.args...)
			cmd := exec.Command(bin, args...)
			cmd.Env = append(os.Environ(), "CELLA_RUNSC="+runsc)
			if tc.env != "" {
				cmd.Env = append(cmd.Env, tc.env)
			}
			var out lockedBuf // shell_test.go
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			// A daemon that got as far as its probe has failed the test
			// already: stop it there rather than wait for it.
			var err error
			for deadline := time.Now().Add(2 * time.Minute); ; {
				select {
				case err = <-exited:
				case <-time.After(100 * time.Millisecond):
					if !strings.Contains(out.String(), "runtime probed") && time.Now().Before(deadline) {
						continue
					}
					cmd.Process.Signal(syscall.SIGTERM)
					err = <-exited
					t.Errorf("cella serve started:\n%s", out.String())
				}
				break
			}
			// A daemon stopped before it handled signals left its mounts.
			if left, _ := rootfs.FindMounts(filepath.Dir(dataDir)); len(left) > 0 {
				t.Errorf("cella serve left mounts: %v", left)
				for i := len(left) - 1; i >= 0; i-- {
					rootfs.Detach(left[i])
				}
			}
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() == 0 {
				t.Errorf("cella serve: %v, want a non-zero exit", err)
			}
			log := out.String()
			if !strings.Contains(log, tc.want) {
				t.Errorf("output %q\nwant %q", log, tc.want)
			}
			if strings.Contains(log, "runtime probed") {
				t.Errorf("the runtime was probed:\n%s", log)
			}
			if _, err := os.Stat(dataDir); err == nil {
				t.Errorf("the data dir was made:\n%s", log)
			}
		})
	}
}

// TestClientIgnoresServeConfig: client commands read none of cella
// serve's variables (a bad one was reported as "cella serve: ..." by every
// command, since making the command tree parsed them).
func TestClientIgnoresServeConfig(t *testing.T) {
	bin, _ := daemontest.Binaries(t)
	cmd := exec.Command(bin, "ls")
	cmd.Env = append(os.Environ(), "CELLA_URL=http://"+freePort(t), "CELLA_API_KEY=e2b_test",
		"CELLA_AUTO_STOP=soon", "CELLA_POOL=x", "CELLA_AUDIT_RETENTION=bad", "CELLA_NO_NETWORK=yes", "CELLA_MAX_PIDS=many")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 125 {
		t.Fatalf("cella ls against no daemon: %v, want exit 125\n%s", err, out)
	}
	if got := string(out); !strings.HasPrefix(got, "cella: cannot reach the cella daemon") || strings.Count(got, "\n") != 1 {
		t.Errorf("cella ls printed %q, want only that the daemon is unreachable", got)
	}
}

// TestRegistryAuthNotInHelp: CELLA_REGISTRY_AUTH holds a password; --help
// printed it as the flag's default.
func TestRegistryAuthNotInHelp(t *testing.T) {
	t.Setenv("CELLA_REGISTRY_AUTH", "bob:hunter2")
	tpl := newTemplateCmd()
	for _, sub := range []string{"build", "push"} {
		c, _, err := tpl.Find([]string{sub})
		if err != nil {
			t.Fatal(err)
		}
		if usage := c.Flags().FlagUsages(); strings.Contains(usage, "hunter2") {
			t.Errorf("cella template %s --help shows the password:\n%s", sub, usage)
		}
	}
}
