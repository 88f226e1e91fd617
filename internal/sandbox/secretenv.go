package sandbox

import (
	"context"
	"fmt"

	"github.com/cella-sandbox/cella/internal/channel"
)

// Secret environment variables (Options.SecretEnv: env var → secret name)
// never go into the agent's config: that is a file, in the sandbox's run
// dir until the agent's hello and on the host's disk as the copy cold boots
// start from. Their values are read from the secret store when a fresh
// agent has said hello and sent to it over the authenticated channel (the
// /init the pool and forks use), before the sandbox is anyone's: they live
// in the agent's memory and its commands' environments only.

// secretEnv reads the values of sb's secret environment variables. A
// secret deleted since the sandbox was made leaves its variable unset.
func (m *Manager) secretEnv(sb *Sandbox) map[string]string {
	if len(sb.Options.SecretEnv) == 0 || m.cfg.SecretValue == nil {
		return nil
	}
	env := make(map[string]string, len(sb.Options.SecretEnv))
	for k, name := range sb.Options.SecretEnv {
		if v, err := m.cfg.SecretValue(name); err == nil {
			env[k] = v
		}
	}
	return env
}

// sendSecretEnv gives a freshly booted agent its secret environment.
func (m *Manager) sendSecretEnv(ctx context.Context, sb *Sandbox, conn *channel.Conn) error {
	env := m.secretEnv(sb)
	if len(env) == 0 {
		return nil
	}
	if err := reinitAgent(ctx, conn, sb.EnvdAccessToken, sb, env); err != nil {
		return fmt.Errorf("sandbox %s: secret environment: %w", sb.ID, err)
	}
	return nil
}
