package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/cella-sandbox/cella/internal/apiwire"
	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/secrets"
	"github.com/cella-sandbox/cella/internal/store"
)

// ceilingHint is how an operator raises the ceiling, for 403 answers.
const ceilingHint = "an operator can raise it with `cella serve --egress-allow HOST` (the daemon's ceiling) or `cella key create --egress-allow HOST` (a key's own ceiling)"

// egressCeiling is what the caller's key may reach at most: the daemon's
// ceiling, narrowed by the key's own list when it has one. nil means the
// daemon runs sandboxes with no network at all.
func (s *Server) egressCeiling(k store.APIKey) *egress.Policy {
	if s.cfg.EgressCeiling == nil {
		return nil
	}
	c := *s.cfg.EgressCeiling
	if len(k.EgressAllow) == 0 {
		return &c
	}
	narrowed, err := egress.Policy{AllowOut: k.EgressAllow}.Narrow(c)
	if err != nil {
		// The key's list was checked when it was made; the daemon's
		// ceiling shrank since: the key gets only what both allow.
		var allow []string
		for _, e := range k.EgressAllow {
			if _, err := (egress.Policy{AllowOut: []string{e}}).Narrow(c); err == nil {
				allow = append(allow, e)
			}
		}
		return &egress.Policy{AllowOut: allow, DenyOut: c.DenyOut}
	}
	narrowed.DenyOut = c.DenyOut
	return &narrowed
}

// requestEgress is the policy a request's allow_internet_access and network
// fields give the sandbox, within the ceiling of the caller's key; only the
// admin key may attach secrets. The daemon must have a ceiling
// (cfg.EgressCeiling != nil).
func (s *Server) requestEgress(r *http.Request, allowInternet *bool, network json.RawMessage) (*egress.Policy, error) {
	p := caller(r)
	return effectiveEgress(allowInternet, network, *p.Ceiling, p.MayUseSecret)
}

// effectiveEgress turns E2B's request fields into the policy the proxy
// enforces, under ceiling. E2B's rules: allowOut entries are exceptions to
// denyOut, and allow_internet_access false is denyOut ["0.0.0.0/0"]. With
// no catch-all deny, the sandbox gets the whole ceiling minus its denyOut;
// with one, exactly its allowOut. A request can never reach past the
// ceiling: an explicit allowOut entry outside it is a 403.
func effectiveEgress(allowInternet *bool, network json.RawMessage, ceiling egress.Policy, mayUseSecret func(name string) bool) (*egress.Policy, error) {
	req, err := egress.ParsePolicy(network)
	if err != nil {
		return nil, errdefs.InvalidArgument("network: %v", err)
	}
	if len(req.AllowOut) > 0 {
		if _, err := (egress.Policy{AllowOut: req.AllowOut}).Narrow(ceiling); err != nil {
			var oc *egress.OutsideCeilingError
			if errors.As(err, &oc) {
				return nil, errdefs.Forbidden("network.allowOut entry %q is outside this sandbox's egress ceiling (%s); %s",
					oc.Entry, ceilingText(oc.Ceiling), ceilingHint)
			}
			return nil, errdefs.InvalidArgument("network.allowOut: %v", err)
		}
	}
	for host, rules := range req.Rules {
		for _, r := range rules {
			if r.Transform == nil {
				continue
			}
			for h, v := range r.Transform.Headers {
				// A malformed placeholder is refused (ParsePolicy has
				// rejected it already).
				names, err := secrets.Names(v)
				if err != nil {
					return nil, errdefs.InvalidArgument("network.rules[%q] header %q: %v", host, h, err)
				}
				for _, n := range names {
					if !mayUseSecret(n) {
						return nil, errdefs.Forbidden("network.rules[%q] header %q uses secret %q, which this API key may not use: "+
							"only the admin key and keys made with `cella key create --secrets %s` may attach it", host, h, n, n)
					}
				}
			}
		}
	}
	catchAll := allowInternet != nil && !*allowInternet
	var deny []string
	for _, d := range req.DenyOut {
		switch d {
		case "0.0.0.0/0", "::/0", "*":
			catchAll = true
		default:
			deny = append(deny, d)
		}
	}
	out := &egress.Policy{Rules: req.Rules}
	if catchAll {
		out.AllowOut = slices.Clone(req.AllowOut)
		out.DenyOut = slices.Clone(ceiling.DenyOut)
	} else {
		out.AllowOut = slices.Clone(ceiling.AllowOut)
		out.DenyOut = append(slices.Clone(ceiling.DenyOut), deny...)
	}
	if err := out.Validate(); err != nil {
		return nil, errdefs.InvalidArgument("network: %v", err)
	}
	return out, nil
}

func ceilingText(entries []string) string {
	if len(entries) == 0 {
		return "no egress at all"
	}
	return "allowed: " + strings.Join(entries, ", ")
}

// networkUpdate is E2B's SandboxNetworkUpdateConfig: the egress fields of
// network plus allow_internet_access; an omitted field is cleared. Not
// apiwire.SandboxNetworkUpdateConfig: rules are egress.Rule, the proxy's own
// type, which the update hands on as it is.
type networkUpdate struct {
	AllowOut            []string                 `json:"allowOut,omitempty"`
	DenyOut             []string                 `json:"denyOut,omitempty"`
	Rules               map[string][]egress.Rule `json:"rules,omitempty"`
	AllowInternetAccess *bool                    `json:"allow_internet_access,omitempty"`
}

// updateNetwork is PUT /sandboxes/{id}/network: the new policy holds for
// every connection and DNS query that starts after the 204.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sb, err := s.cfg.Manager.Lookup(caller(r), id)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	p, merged, allowInternet, err := s.parseNetworkUpdate(r, sb.Options.Network)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if err := s.cfg.Manager.SetNetwork(r.Context(), caller(r), id, p, merged, allowInternet); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// parseNetworkUpdate reads PUT /sandboxes/{id}/network for a sandbox whose
// create request's network object was stored: the policy it gives within
// the caller's ceiling, the network object to store, and
// allow_internet_access.
func (s *Server) parseNetworkUpdate(r *http.Request, stored json.RawMessage) (*egress.Policy, json.RawMessage, *bool, error) {
	var req networkUpdate
	if err := decodeBody(r, &req); err != nil {
		return nil, nil, nil, err
	}
	if s.cfg.EgressCeiling == nil {
		return nil, nil, nil, errdefs.Forbidden("this daemon gives sandboxes no network at all (cella serve --network=false), so there is no egress policy to update")
	}
	// egress.Policy's JSON: allowOut, denyOut and rules, each left out
	// when empty (AllowInternet is false, so left out too).
	raw, _ := json.Marshal(egress.Policy{AllowOut: req.AllowOut, DenyOut: req.DenyOut, Rules: req.Rules})
	p, err := s.requestEgress(r, req.AllowInternetAccess, raw)
	if err != nil {
		return nil, nil, nil, err
	}
	// Fields of the original request other than egress (allowPublicTraffic
	// and friends) stay as they were.
	return p, mergeNetwork(stored, raw), req.AllowInternetAccess, nil
}

// mergeNetwork replaces the egress fields of a stored network object.
func mergeNetwork(stored, egressFields json.RawMessage) json.RawMessage {
	m := map[string]json.RawMessage{}
	_ = json.Unmarshal(stored, &m)
	for _, k := range []string{"allowOut", "denyOut", "rules"} {
		delete(m, k)
	}
	var e map[string]json.RawMessage
	_ = json.Unmarshal(egressFields, &e)
	for k, v := range e {
		m[k] = v
	}
	if len(m) == 0 {
		return nil
	}
	b, _ := json.Marshal(m)
	return b
}

// networkInfoOf is E2B's SandboxNetworkInfo (what was asked) plus what
// cella enforces: effective, the request within the operator's ceiling,
// and summary, which says it in words.
func networkInfoOf(raw json.RawMessage, p *egress.Policy, enabled bool) apiwire.SandboxNetworkInfo {
	// The stored request, read leniently (it passed the egress parser at
	// create); rules as egress.Rule, which redactRules shows.
	var req struct {
		AllowOut           []string                 `json:"allowOut"`
		DenyOut            []string                 `json:"denyOut"`
		Rules              map[string][]egress.Rule `json:"rules"`
		AllowPublicTraffic *bool                    `json:"allowPublicTraffic"`
		MaskRequestHost    string                   `json:"maskRequestHost"`
	}
	_ = json.Unmarshal(raw, &req)
	ni := apiwire.SandboxNetworkInfo{
		AllowOut: nonNil(req.AllowOut), DenyOut: nonNil(req.DenyOut), Rules: redactRules(req.Rules),
		AllowPublicTraffic: req.AllowPublicTraffic, MaskRequestHost: req.MaskRequestHost,
		Effective: apiwire.SandboxEgressPolicy{AllowOut: []string{}, DenyOut: []string{}},
	}
	switch {
	case !enabled:
		ni.Summary = "no network at all: this daemon runs sandboxes without a network (cella serve --network=false)"
	case p == nil || len(p.AllowOut) == 0:
		ni.Summary = "no egress: nothing is allowed for this sandbox"
	default:
		ni.Effective = apiwire.SandboxEgressPolicy{AllowOut: nonNil(p.AllowOut), DenyOut: nonNil(p.DenyOut), Rules: redactRules(p.Rules)}
		ni.Summary = p.Summary()
	}
	return ni
}

// redactRules shows header rules without their values: a value may be a
// literal credential.
func redactRules(rules map[string][]egress.Rule) map[string][]apiwire.SandboxNetworkRule {
	if len(rules) == 0 {
		return nil
	}
	out := make(map[string][]apiwire.SandboxNetworkRule, len(rules))
	for host, rs := range rules {
		for _, r := range rs {
			nr := apiwire.SandboxNetworkRule{Scheme: r.Scheme, Port: r.Port}
			if r.Transform != nil {
				h := map[string]string{}
				for k, v := range r.Transform.Headers {
					if names, _ := secrets.Names(v); len(names) > 0 {
						h[k] = "[secret:" + strings.Join(names, ",") + "]"
					} else {
						h[k] = "[redacted]"
					}
				}
				nr.Transform = apiwire.SandboxNetworkTransform{Headers: h} // {} when it has none, as before
			}
			out[host] = append(out[host], nr)
		}
	}
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// checkSecretEnv vets a request's secretEnvVars: only secrets the key may
// use (a secret in the environment is readable by everything in the
// sandbox, and by every key of its team, which may exec in it), and every
// named secret must exist.
func (s *Server) checkSecretEnv(r *http.Request, env map[string]string) error {
	p := caller(r)
	for k, name := range env {
		if !p.MayUseSecret(name) {
			return errdefs.Forbidden("secretEnvVars[%q]: secret %q may not be used by this API key: "+
				"only the admin key and keys made with `cella key create --secrets %s` may put it in an environment", k, name, name)
		}
	}
	if s.cfg.Secrets == nil {
		return errdefs.InvalidArgument("secretEnvVars: this daemon has no secret store")
	}
	for k, name := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return errdefs.InvalidArgument("secretEnvVars: invalid variable name %q", k)
		}
		if _, err := s.cfg.Secrets.Get(name); err != nil {
			return errdefs.InvalidArgument("secretEnvVars[%q]: secret %q does not exist (create it with cella secret set %s)", k, name, name)
		}
	}
	return nil
}
