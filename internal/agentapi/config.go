package agentapi

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// ConfigName is the config file's name in the sandbox's run directory
// (GuestRunDir inside, read-only). The daemon writes it before a cold boot
// and removes it once the agent has said hello: the agent reads it once, at
// start. The daemon keeps a copy without the channel credential on the host
// (WriteConfigFile, ReadConfigFile) that later cold boots start from.
const ConfigName = "config.json"

// Limits are the sandbox's nominal limits, enforced by the agent below the
// host's cgroup ceilings so that a runaway command is killed with a named
// error instead of taking the whole sandbox down.
type Limits struct {
	CPUs        float64 `json:"cpus"`
	MemoryBytes int64   `json:"memory_bytes"`
	Pids        int64   `json:"pids"`
	DiskBytes   int64   `json:"disk_bytes"`
	// OutputBytes caps each command's combined stdout+stderr; past it the
	// output is truncated with a marker (the process keeps running).
	OutputBytes int64 `json:"output_bytes"`
}

// Config is everything the agent needs to know about its sandbox.
type Config struct {
	SandboxID  string `json:"sandbox_id"`
	TemplateID string `json:"template_id"`
	Runtime    string `json:"runtime"` // gvisor | namespaces
	// ChannelToken authenticates the agent's first hello to the daemon
	// (channel.Hello); the daemon replaces it over the channel after every
	// hello (ChannelTokenPath).
	ChannelToken string `json:"channel_token"`
	// AccessToken is envd's X-Access-Token; empty means no check.
	AccessToken    string            `json:"access_token"`
	EnvVars        map[string]string `json:"env_vars"`
	DefaultUser    string            `json:"default_user"`    // "user"
	DefaultWorkdir string            `json:"default_workdir"` // "" = the user's home
	Limits         Limits            `json:"limits"`
	// Services are what the agent runs besides its own API, from the
	// template (ServiceCodeInterpreter: the server on 127.0.0.1:49999).
	Services []string `json:"services,omitempty"`
}

// HasService reports whether the template asked for a service.
func (c Config) HasService(name string) bool { return slices.Contains(c.Services, name) }

// WriteConfig writes cfg into a sandbox's host-side run directory, readable by
// root only.
func WriteConfig(runDir string, cfg Config) error {
	return WriteConfigFile(filepath.Join(runDir, ConfigName), cfg)
}

// WriteConfigFile writes cfg to path (atomically, readable by root only).
func WriteConfigFile(path string, cfg Config) error {
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write agent config: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write agent config: %w", err)
	}
	return nil
}

// ReadConfig reads the config from a run directory.
func ReadConfig(runDir string) (Config, error) {
	return ReadConfigFile(filepath.Join(runDir, ConfigName))
}

// ReadConfigFile reads the config at path.
func ReadConfigFile(path string) (Config, error) {
	var cfg Config
	b, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("read agent config: %w", err)
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return cfg, fmt.Errorf("parse agent config: %w", err)
	}
	return cfg, nil
}
