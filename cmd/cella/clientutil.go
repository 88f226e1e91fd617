package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/cella-sandbox/cella/internal/client"
)

func newClient() (*client.Client, error) {
	cfg, err := client.FromEnv()
	if err != nil {
		return nil, err
	}
	return client.New(cfg)
}

// createFlags are the flags of create and run.
type createFlags struct {
	template string
	timeout  time.Duration
	cpus     float64
	memory   string
	disk     string
	pids     int64
	output   string
	env      []string
	metadata []string
	policy   policyFlags // lifecycleflags.go: --auto-stop, --volume, ...
}

// register adds the flags; timeoutFlag names the sandbox-lifetime flag
// (run keeps --timeout for the command, like exec).
func (f *createFlags) register(fs *pflag.FlagSet, timeoutFlag string) {
	fs.StringVar(&f.template, "template", "base", "template to start from")
	fs.DurationVar(&f.timeout, timeoutFlag, 5*time.Minute, "sandbox lifetime before it is killed")
	fs.Float64Var(&f.cpus, "cpus", 0, "CPU limit in cores (default 1)")
	fs.StringVar(&f.memory, "memory", "", "memory limit, e.g. 512M or 2G (default 512M)")
	fs.StringVar(&f.disk, "disk", "", "writable-layer size, e.g. 1G (default 1G)")
	fs.Int64Var(&f.pids, "pids", 0, "process limit (default 256)")
	fs.StringVar(&f.output, "output-limit", "", "per-command output cap, e.g. 50M (default 10M)")
	fs.StringArrayVar(&f.env, "env", nil, "environment variable K=V for every command (repeatable)")
	fs.StringArrayVar(&f.metadata, "metadata", nil, "metadata K=V (repeatable)")
	f.policy.register(fs)
}

func (f *createFlags) request() (client.CreateRequest, error) {
	req := client.CreateRequest{TemplateID: f.template, CPUCount: f.cpus, PidsLimit: f.pids}
	if f.timeout < 0 {
		return req, fmt.Errorf("--timeout must not be negative")
	}
	if secs := int64((f.timeout + time.Second - 1) / time.Second); secs > 0 {
		req.Timeout = &secs // 0 is left out: the daemon's default
	}
	var err error
	if req.MemoryMB, err = parseMiB(f.memory); err != nil {
		return req, fmt.Errorf("--memory: %w", err)
	}
	if req.DiskSizeMB, err = parseMiB(f.disk); err != nil {
		return req, fmt.Errorf("--disk: %w", err)
	}
	if req.OutputLimitMB, err = parseMiB(f.output); err != nil {
		return req, fmt.Errorf("--output-limit: %w", err)
	}
	if req.EnvVars, err = parseKV(f.env, "--env"); err != nil {
		return req, err
	}
	if req.Metadata, err = parseKV(f.metadata, "--metadata"); err != nil {
		return req, err
	}
	if err := f.policy.apply(&req); err != nil {
		return req, err
	}
	return req, nil
}

// parseMiB reads sizes like 512M, 2G, 1024 (MiB).
func parseMiB(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	u := strings.ToUpper(strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(s), "B"), "I"))
	mult := int64(1)
	switch {
	case strings.HasSuffix(u, "G"):
		mult, u = 1024, strings.TrimSuffix(u, "G")
	case strings.HasSuffix(u, "M"):
		u = strings.TrimSuffix(u, "M")
	}
	n, err := strconv.ParseInt(u, 10, 64)
	if err != nil || n <= 0 || n > math.MaxInt64>>20/mult {
		return 0, fmt.Errorf("invalid size %q (use e.g. 512M or 2G)", s)
	}
	return n * mult, nil
}

func parseKV(items []string, flag string) (map[string]string, error) {
	if len(items) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, it := range items {
		k, v, ok := strings.Cut(it, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: use K=V", flag, it)
		}
		out[k] = v
	}
	return out, nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
