// Package tenant says who owns what and who may act on it. Every resource a
// caller makes (sandbox, snapshot, volume, PTY session, audit log, metrics)
// carries an Owner: the team whose keys share it, and the key that made it
// (E2B's model: a team's keys see the team's sandboxes). Every request is
// made by a Principal; Principal.Can is the one rule, applied where the
// core looks a resource up for a caller (sandbox.Manager.Lookup, the volume
// and snapshot lookups), so that an unknown and a foreign resource answer
// the same not-found.
package tenant

import (
	"slices"

	"github.com/cella-sandbox/cella/internal/egress"
)

// AdminTeam is the team of the admin key made on first start.
const AdminTeam = "admin"

// Owner is who a resource belongs to.
type Owner struct {
	// Team is the team whose keys may see and act on the resource.
	Team string `json:"team,omitempty"`
	// Key is the API key that made it (for the record; access is by team).
	Key string `json:"key,omitempty"`
}

// Principal is who is asking: an API key, its team and what the key may do
// beyond its team's resources.
type Principal struct {
	Key  string
	Team string
	// Admin sees and acts on every team's resources, and may use every
	// secret.
	Admin bool
	// Secrets are the names of the secrets this key may attach to requests
	// (header rules) or put in an environment ("*": all). Admin keys may use
	// all.
	Secrets []string
	// Ceiling is the most egress this key's sandboxes may have: the daemon's
	// ceiling narrowed by the key's own. nil: the daemon gives sandboxes no
	// network at all.
	Ceiling *egress.Policy
}

// System is the daemon acting for itself (reaper, pools, reconciliation,
// tests of the core): it may act on everything.
var System = Principal{Key: "system", Team: AdminTeam, Admin: true}

// Traffic is a request to a sandbox's own ports through the sandbox proxy.
// E2B's edge routes such requests by sandbox ID alone; what authorizes one
// is a credential of that sandbox, not an API key: its envd access token
// for the agent's port (which only its team can read), and for its other
// ports its traffic token when it was made with allowPublicTraffic false
// (else they are public, as E2B's are). The proxy checks both before
// anything reaches the sandbox.
var Traffic = Principal{Key: "traffic", Admin: true}

// Owner is what the principal's new resources are owned by.
func (p Principal) Owner() Owner { return Owner{Team: p.Team, Key: p.Key} }

// Can reports whether p may see and act on a resource owned by o: the admin
// may act on everything, any other key on its own team's resources only. A
// resource without a team (made before teams existed and never migrated)
// belongs to the admin.
func (p Principal) Can(o Owner) bool {
	if p.Admin {
		return true
	}
	return p.Team != "" && o.Team == p.Team
}

// MayUseSecret reports whether p may make the proxy attach the named secret
// or put it in a sandbox's environment.
func (p Principal) MayUseSecret(name string) bool {
	return p.Admin || slices.Contains(p.Secrets, "*") || slices.Contains(p.Secrets, name)
}
