package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cella-sandbox/cella/internal/quota"
)

// encodeList is how a key's lists (egress ceiling, secrets) are stored:
// their JSON, or "" for none.
func encodeList(list []string) string {
	if len(list) == 0 {
		return ""
	}
	b, _ := json.Marshal(list)
	return string(b)
}

func parseList(v string) []string {
	if v == "" {
		return nil
	}
	var out []string
	_ = json.Unmarshal([]byte(v), &out)
	return out
}

// AdminKeyID is the ID of the key made on first start.
const AdminKeyID = "admin"

// idAlphabet is what record IDs are made of: lowercase letters and
// digits, so an ID is a valid DNS label (E2B's sandbox and template IDs).
const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// NewID returns a random 20-character [a-z0-9] ID, E2B's form of sandbox,
// snapshot and template IDs.
func NewID() string {
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return string(b)
}

// NewKeySecret returns a new API key: "e2b_" and 32 hex digits (128
// random bits), the form E2B's SDKs expect.
func NewKeySecret() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate api key: %w", err)
	}
	return "e2b_" + hex.EncodeToString(b), nil
}

// NewKey is what CreateAPIKey makes a key from.
type NewKey struct {
	Name string
	// Team is the name of the team the key joins; "" makes a new team named
	// after the key. A team that does not exist yet is made.
	Team        string
	MCPMaxCalls int64
	// EgressAllow is the key's own egress ceiling (nil: the daemon's).
	EgressAllow []string
	// Secrets are the secrets the key may attach ("*": all).
	Secrets []string
	// Limits are the key's quota (zero fields: unlimited).
	Limits quota.Limits
}

// CreateAPIKey makes a new key (and its team when it has none yet) and
// returns it; only its hash is kept.
func (s *Store) CreateAPIKey(ctx context.Context, nk NewKey) (APIKey, string, error) {
	key, err := NewKeySecret()
	if err != nil {
		return APIKey{}, "", err
	}
	idb := make([]byte, 6)
	if _, err := rand.Read(idb); err != nil {
		return APIKey{}, "", err
	}
	if nk.Team != "" && !TeamNameRe.MatchString(nk.Team) {
		return APIKey{}, "", fmt.Errorf("invalid team name %q", nk.Team)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return APIKey{}, "", err
	}
	defer tx.Rollback()
	var team Team
	switch t, err := teamByName(ctx, tx, nk.Team); {
	case nk.Team != "" && err == nil:
		team = t
	case nk.Team != "" && !errors.Is(err, ErrNotFound):
		return APIKey{}, "", err
	default:
		base := nk.Team
		if base == "" {
			base = nk.Name
		}
		if team, err = insertTeam(ctx, tx, base); err != nil {
			return APIKey{}, "", err
		}
	}
	k := APIKey{ID: "k" + hex.EncodeToString(idb), Name: nk.Name, TeamID: team.ID, TeamName: team.Name,
		MCPMaxCalls: nk.MCPMaxCalls, EgressAllow: nk.EgressAllow, Secrets: nk.Secrets, Limits: nk.Limits}
	if k, err = insertAPIKey(ctx, tx, k, key); err != nil {
		return APIKey{}, "", err
	}
	if err := tx.Commit(); err != nil {
		return APIKey{}, "", fmt.Errorf("store api key %s: %w", k.Name, err)
	}
	return k, key, nil
}

// insertAPIKey stores the hash of key with k's fields, created now, and
// returns k with its CreatedAt set.
func insertAPIKey(ctx context.Context, db execQuerier, k APIKey, key string) (APIKey, error) {
	k.CreatedAt = time.Now().Truncate(time.Second)
	l := k.Limits
	_, err := db.ExecContext(ctx, `INSERT INTO api_keys(id,name,hash,created_at,mcp_max_calls,egress_allow,team_id,secrets,
		max_sandboxes,max_vcpus,max_memory_mb,create_rate,request_rate) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		k.ID, k.Name, HashKey(key), k.CreatedAt.Unix(), k.MCPMaxCalls, encodeList(k.EgressAllow), k.TeamID, encodeList(k.Secrets),
		l.MaxSandboxes, l.MaxVCPUs, l.MaxMemoryMB, l.CreateRate.String(), l.RequestRate.String())
	if err != nil {
		return APIKey{}, fmt.Errorf("store api key %s: %w", k.Name, err)
	}
	return k, nil
}

// keyCols are the columns scanKey reads.
const keyCols = `k.id,k.name,k.created_at,k.mcp_max_calls,k.egress_allow,k.team_id,COALESCE(t.name,''),k.secrets,` +
	`k.max_sandboxes,k.max_vcpus,k.max_memory_mb,k.create_rate,k.request_rate`

func scanKey(r scanner) (APIKey, error) {
	var k APIKey
	var created int64
	var egressAllow, secrets, createRate, requestRate string
	if err := r.Scan(&k.ID, &k.Name, &created, &k.MCPMaxCalls, &egressAllow, &k.TeamID, &k.TeamName, &secrets,
		&k.Limits.MaxSandboxes, &k.Limits.MaxVCPUs, &k.Limits.MaxMemoryMB, &createRate, &requestRate); err != nil {
		return k, err
	}
	var err error
	if k.Limits.CreateRate, err = quota.ParseRate(createRate); err != nil {
		return k, fmt.Errorf("api key %s: createRate: %w", k.ID, err)
	}
	if k.Limits.RequestRate, err = quota.ParseRate(requestRate); err != nil {
		return k, fmt.Errorf("api key %s: requestRate: %w", k.ID, err)
	}
	k.EgressAllow = parseList(egressAllow)
	k.Secrets = parseList(secrets)
	k.CreatedAt = time.Unix(created, 0)
	return k, nil
}

// ListAPIKeys returns every key's public part.
func (s *Store) ListAPIKeys(ctx context.Context) ([]APIKey, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+keyCols+` FROM api_keys k LEFT JOIN teams t ON t.id=k.team_id ORDER BY k.created_at, k.id`)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// DeleteAPIKey removes a key; it reports ErrNotFound for an unknown ID. Its
// team and the team's resources stay.
func (s *Store) DeleteAPIKey(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM api_keys WHERE id=?`, id)
	if err != nil {
		return fmt.Errorf("delete api key %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}
