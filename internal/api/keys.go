package api

import (
	"errors"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/quota"
	"github.com/cella-sandbox/cella/internal/secrets"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// keyInfo is an API key's public part; Key is set only in the answer that
// creates it. Not apiwire.APIKey: the generated usage.vcpus is a float32,
// which would round what this answer has always given as a float64.
type keyInfo struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Key  string `json:"key,omitempty"`
	// TeamID and Team are the team whose sandboxes, snapshots and volumes
	// the key shares.
	TeamID string `json:"teamID"`
	Team   string `json:"team"`
	// Secrets are the secrets the key may attach ("*": all; the admin key
	// may use every secret).
	Secrets     []string  `json:"secrets"`
	MCPMaxCalls int64     `json:"mcpMaxCalls"`
	CreatedAt   time.Time `json:"createdAt"`
	// EgressAllow is the key's own egress ceiling (empty: the daemon's).
	EgressAllow []string `json:"egressAllow"`
	// Egress says in words what this key's sandboxes may reach at most.
	Egress string `json:"egress"`
	// The key's quota (quotas.go; the admin key's is all zero: unlimited)
	// and what it holds now against it.
	keyLimits
	Usage keyUsage `json:"usage"`
}

func (s *Server) keyBody(k store.APIKey) keyInfo {
	secrets := nonNil(k.Secrets)
	if k.ID == store.AdminKeyID {
		secrets = []string{"*"}
	}
	var u keyUsage
	if s.cfg.Manager != nil {
		u.Sandboxes, u.VCPUs, u.MemoryMB = s.cfg.Manager.Usage(k.ID)
	}
	return keyInfo{ID: k.ID, Name: k.Name, TeamID: k.TeamID, Team: k.TeamName, Secrets: secrets,
		MCPMaxCalls: k.MCPMaxCalls, CreatedAt: k.CreatedAt.UTC(), EgressAllow: nonNil(k.EgressAllow), Egress: s.egressText(k),
		keyLimits: limitsBody(k.Limits), Usage: u}
}

// egressText describes a key's ceiling for people and agents (MCP tool
// descriptions are built from it).
func (s *Server) egressText(k store.APIKey) string {
	c := s.egressCeiling(k)
	switch {
	case s.cfg.EgressCeiling == nil:
		return "none: sandboxes have no network at all on this daemon"
	case c == nil || len(c.AllowOut) == 0:
		return "none: no egress is allowed (an operator can allow hosts with cella serve --egress-allow)"
	}
	return "only through cella's egress proxy, to at most " + strings.Join(c.AllowOut, ", ") +
		"; everything else is blocked and each block is reported in sandbox_events; a sandbox can narrow this with network.allowOut/denyOut"
}

var keyNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// isAdmin says whether the request was made with the admin key.
func isAdmin(r *http.Request) bool { return caller(r).Admin }

// adminOnly lets only the admin key through to h; any other key gets 403
// "only the admin key (<data-dir>/admin.key) may " + what.
func (s *Server) adminOnly(what string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !isAdmin(r) {
			s.writeErr(w, r, errdefs.Forbidden("only the admin key (<data-dir>/admin.key) may %s", what))
			return
		}
		h(w, r)
	}
}

// parseKeyCreate reads POST /keys {"name", "team"?, "mcpMaxCalls"?,
// "egressAllow"?, "secrets"?, "maxSandboxes"?, "maxVcpus"?, "maxMemoryMB"?,
// "createRate"?, "requestRate"?}.
func (s *Server) parseKeyCreate(r *http.Request) (store.NewKey, error) {
	var req struct {
		Name string `json:"name"`
		// Team is the team to join (made if it does not exist); "" makes a
		// team of the key's own, named after it.
		Team        string   `json:"team"`
		MCPMaxCalls int64    `json:"mcpMaxCalls"`
		EgressAllow []string `json:"egressAllow"`
		Secrets     []string `json:"secrets"`
		limitsRequest
	}
	if err := decodeBody(r, &req); err != nil {
		return store.NewKey{}, err
	}
	var limits quota.Limits
	if err := req.limitsRequest.apply(&limits); err != nil { // quotas.go
		return store.NewKey{}, err
	}
	if !keyNameRe.MatchString(req.Name) {
		return store.NewKey{}, errdefs.InvalidArgument("invalid key name %q: use letters, digits, '.', '_' and '-'", req.Name)
	}
	if req.Team != "" && !store.TeamNameRe.MatchString(req.Team) {
		return store.NewKey{}, errdefs.InvalidArgument("invalid team name %q: use 1-63 lower-case letters, digits, '.', '_' and '-', starting with a letter or digit", req.Team)
	}
	if req.Team == tenant.AdminTeam {
		return store.NewKey{}, errdefs.InvalidArgument("the admin team is the admin key's alone: give the key another team")
	}
	for _, name := range req.Secrets {
		if name == "*" {
			continue
		}
		if err := secrets.ValidateName(name); err != nil {
			return store.NewKey{}, errdefs.InvalidArgument("secrets: %v", err)
		}
	}
	if req.MCPMaxCalls < 0 {
		return store.NewKey{}, errdefs.InvalidArgument("mcpMaxCalls must not be negative (got %d)", req.MCPMaxCalls)
	}
	if len(req.EgressAllow) > 0 {
		if s.cfg.EgressCeiling == nil {
			return store.NewKey{}, errdefs.InvalidArgument("egressAllow: this daemon gives sandboxes no network at all")
		}
		if _, err := (egress.Policy{AllowOut: req.EgressAllow}).Narrow(*s.cfg.EgressCeiling); err != nil {
			// Only an entry outside the ceiling is the operator's to allow;
			// a malformed one is bad input.
			var oc *egress.OutsideCeilingError
			if errors.As(err, &oc) {
				return store.NewKey{}, errdefs.Forbidden("egressAllow: %v; %s", err, ceilingHint)
			}
			return store.NewKey{}, errdefs.InvalidArgument("egressAllow: %v", err)
		}
	}
	return store.NewKey{Name: req.Name, Team: req.Team, MCPMaxCalls: req.MCPMaxCalls, EgressAllow: req.EgressAllow, Secrets: req.Secrets, Limits: limits}, nil
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) {
	nk, err := s.parseKeyCreate(r)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	k, key, err := s.cfg.Store.CreateAPIKey(r.Context(), nk)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	body := s.keyBody(k)
	body.Key = key
	writeJSON(w, http.StatusCreated, body)
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) {
	keys, err := s.cfg.Store.ListAPIKeys(r.Context())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := []keyInfo{}
	for _, k := range keys {
		out = append(out, s.keyBody(k))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) selfKey(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.keyBody(apiKeyFrom(r.Context())))
}

func (s *Server) deleteKey(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if id == store.AdminKeyID {
		s.writeErr(w, r, errdefs.Conflict("the admin key cannot be deleted"))
		return
	}
	if err := s.cfg.Store.DeleteAPIKey(r.Context(), id); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			s.writeErr(w, r, errdefs.NotFound("API key %q not found", id))
			return
		}
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// mcpBudget is the tool-call budget of an MCP session: the key's own, else
// the daemon's default.
func (s *Server) mcpBudget(r *http.Request) int64 {
	if k := apiKeyFrom(r.Context()); k.MCPMaxCalls > 0 {
		return k.MCPMaxCalls
	}
	return s.cfg.MCPMaxCalls
}
