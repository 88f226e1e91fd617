package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/secrets"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// restrictTo gives options taken from another sandbox (a snapshot's, a
// fork's original's) to a sandbox that p makes: it is owned by p, and it
// gets nothing p could not have asked for itself — its egress within p's
// ceiling, only the secrets p may use (header rules and environment), a
// traffic token of its own, an envd token required (secure). dropped says in words what was taken away.
//
// memory says the new sandbox restores the original's processes: their
// environments hold the values of the original's secret environment
// variables, which cannot be taken back out, so a p that may not use one
// of those secrets is refused.
func restrictTo(p tenant.Principal, o Options, memory bool) (_ Options, dropped []string, _ error) {
	o.APIKeyID, o.TeamID = p.Key, p.Team
	// Secure again: its token goes to p alone, not to whoever holds an ID.
	o.Insecure = false
	if o.TrafficAccessToken != "" {
		o.TrafficAccessToken = newTrafficToken()
	}
	var refused []string
	if len(o.SecretEnv) > 0 {
		env := map[string]string{}
		for k, name := range o.SecretEnv {
			if p.MayUseSecret(name) {
				env[k] = name
				continue
			}
			refused = append(refused, name)
			dropped = append(dropped, fmt.Sprintf("secret environment variable %s (secret %s)", k, name))
		}
		o.SecretEnv = env
	}
	if memory && len(refused) > 0 {
		sort.Strings(refused)
		return Options{}, nil, errdefs.Forbidden("the memory of this sandbox holds the values of secrets this API key may not use (%s), "+
			"put in its environment with secretEnvVars: only a key allowed to use them (the admin key, or one made with cella key create --secrets) may fork or restore it",
			strings.Join(slices.Compact(refused), ", "))
	}
	if o.Egress != nil {
		if p.Ceiling == nil {
			o.Egress = nil
			dropped = append(dropped, "all egress (this daemon gives sandboxes no network)")
		} else {
			within, err := o.Egress.Within(*p.Ceiling)
			if err != nil {
				return Options{}, nil, fmt.Errorf("egress policy: %w", err)
			}
			for _, e := range o.Egress.AllowOut {
				if !slices.Contains(within.AllowOut, e) {
					dropped = append(dropped, "egress to "+e+" (outside this key's ceiling)")
				}
			}
			within.Rules, dropped = rulesFor(p, within.Rules, dropped)
			o.Egress = &within
			o.Network = withRules(o.Network, within.Rules)
		}
	}
	return o, dropped, nil
}

// withRules replaces the rules of a stored network request (what the
// sandbox shows it asked for) with those it got.
func withRules(network json.RawMessage, rules map[string][]egress.Rule) json.RawMessage {
	m := map[string]json.RawMessage{}
	if json.Unmarshal(network, &m) != nil {
		return network
	}
	if _, ok := m["rules"]; !ok && len(rules) == 0 {
		return network
	}
	delete(m, "rules")
	if len(rules) > 0 {
		b, err := json.Marshal(rules)
		if err != nil {
			return network
		}
		m["rules"] = b
	}
	b, err := json.Marshal(m)
	if err != nil {
		return network
	}
	return b
}

// rulesFor keeps the header rules whose secrets p may use; a header whose
// value names another secret is dropped (and a rule left without headers).
func rulesFor(p tenant.Principal, rules map[string][]egress.Rule, dropped []string) (map[string][]egress.Rule, []string) {
	if len(rules) == 0 {
		return rules, dropped
	}
	out := make(map[string][]egress.Rule, len(rules))
	for _, host := range slices.Sorted(maps.Keys(rules)) {
		for _, r := range rules[host] {
			if r.Transform == nil {
				out[host] = append(out[host], r)
				continue
			}
			kept := map[string]string{}
			for _, h := range slices.Sorted(maps.Keys(r.Transform.Headers)) {
				v := r.Transform.Headers[h]
				if mayUseAll(p, v) {
					kept[h] = v
					continue
				}
				dropped = append(dropped, fmt.Sprintf("header %s for %s (it uses a secret this key may not use)", h, host))
			}
			if len(kept) > 0 {
				nr := r
				nr.Transform = &egress.Transform{Headers: kept}
				out[host] = append(out[host], nr)
			}
		}
	}
	return out, dropped
}

// mayUseAll reports whether p may use every secret a header value names.
func mayUseAll(p tenant.Principal, value string) bool {
	names, err := secrets.Names(value)
	if err != nil {
		return false
	}
	for _, n := range names {
		if !p.MayUseSecret(n) {
			return false
		}
	}
	return true
}

// newTrafficToken makes a token for a sandbox's non-agent ports.
func newTrafficToken() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
