package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// migrateKeys adds the per-key MCP budget to databases made before it.
func migrateKeys(db *sql.DB) error {
	_, err := db.Exec(`ALTER TABLE api_keys ADD COLUMN mcp_max_calls INTEGER NOT NULL DEFAULT 0`)
	if err != nil && !strings.Contains(err.Error(), "duplicate column") {
		return fmt.Errorf("add api_keys.mcp_max_calls: %w", err)
	}
	_, err = db.Exec(`ALTER TABLE api_keys ADD COLUMN egress_allow TEXT NOT NULL DEFAULT ''`)
	if err != nil && !strings.Contains(err.Error(), "duplicate column") {
		return fmt.Errorf("add api_keys.egress_allow: %w", err)
	}
	return nil
}

// SetKeyEgress sets a key's own egress ceiling (nil: the daemon's).
func (s *Store) SetKeyEgress(ctx context.Context, id string, allow []string) error {
	v := ""
	if len(allow) > 0 {
		b, _ := json.Marshal(allow)
		v = string(b)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE api_keys SET egress_allow=? WHERE id=?`, v, id)
	if err != nil {
		return fmt.Errorf("set egress ceiling of key %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

func parseEgressAllow(v string) []string {
	if v == "" {
		return nil
	}
	var out []string
	_ = json.Unmarshal([]byte(v), &out)
	return out
}

// AdminKeyID is the ID of the key made on first start.
const AdminKeyID = "admin"

// CreateAPIKey makes a new key and returns it; only its hash is kept.
func (s *Store) CreateAPIKey(ctx context.Context, name string, mcpMaxCalls int64) (APIKey, string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return APIKey{}, "", err
	}
	key := "e2b_" + hex.EncodeToString(b)
	idb := make([]byte, 6)
	if _, err := rand.Read(idb); err != nil {
		return APIKey{}, "", err
	}
	k := APIKey{ID: "k" + hex.EncodeToString(idb), Name: name, CreatedAt: time.Now().Truncate(time.Second), MCPMaxCalls: mcpMaxCalls}
	_, err := s.db.ExecContext(ctx, `INSERT INTO api_keys(id,name,hash,created_at,mcp_max_calls) VALUES(?,?,?,?,?)`,
		k.ID, k.Name, HashKey(key), k.CreatedAt.Unix(), k.MCPMaxCalls)
	if err != nil {
		return APIKey{}, "", fmt.Errorf("store api key %s: %w", name, err)
	}
	return k, key, nil
}

// ListAPIKeys returns every key's public part.
func (s *Store) ListAPIKeys(ctx context.Context) ([]APIKey, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id,name,created_at,mcp_max_calls,egress_allow FROM api_keys ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		var k APIKey
		var created int64
		var egressAllow string
		if err := rows.Scan(&k.ID, &k.Name, &created, &k.MCPMaxCalls, &egressAllow); err != nil {
			return nil, err
		}
		k.EgressAllow = parseEgressAllow(egressAllow)
		k.CreatedAt = time.Unix(created, 0)
		out = append(out, k)
	}
	return out, rows.Err()
}

// DeleteAPIKey removes a key; it reports ErrNotFound for an unknown ID.
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
