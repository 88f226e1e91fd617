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

// migrateKeys adds the per-key MCP budget and egress ceiling to databases
// made before them.
func migrateKeys(db *sql.DB) error {
	return addColumns(context.Background(), db, "api_keys",
		column{"mcp_max_calls", "INTEGER NOT NULL DEFAULT 0"},
		column{"egress_allow", "TEXT NOT NULL DEFAULT ''"})
}

// column is a column a later cella added to a table: its name and its
// definition.
type column struct{ name, def string }

// addColumns adds cols to table, each unless it is there already, so that
// a database of an older cella gets them.
func addColumns(ctx context.Context, db *sql.DB, table string, cols ...column) error {
	for _, col := range cols {
		_, err := db.ExecContext(ctx, `ALTER TABLE `+table+` ADD COLUMN `+col.name+` `+col.def)
		if err != nil && !strings.Contains(err.Error(), "duplicate column") {
			return fmt.Errorf("add %s.%s: %w", table, col.name, err)
		}
	}
	return nil
}

// encodeEgressAllow is how a key's egress ceiling is stored: its JSON, or
// "" for none (the daemon's ceiling).
func encodeEgressAllow(allow []string) string {
	if len(allow) == 0 {
		return ""
	}
	b, _ := json.Marshal(allow)
	return string(b)
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

// NewKeySecret returns a new API key: "e2b_" and 32 hex digits (128
// random bits), the form E2B's SDKs expect.
func NewKeySecret() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate api key: %w", err)
	}
	return "e2b_" + hex.EncodeToString(b), nil
}

// CreateAPIKey makes a new key with its MCP budget and its own egress
// ceiling (nil: the daemon's), and returns it; only its hash is kept.
func (s *Store) CreateAPIKey(ctx context.Context, name string, mcpMaxCalls int64, egressAllow []string) (APIKey, string, error) {
	key, err := NewKeySecret()
	if err != nil {
		return APIKey{}, "", err
	}
	idb := make([]byte, 6)
	if _, err := rand.Read(idb); err != nil {
		return APIKey{}, "", err
	}
	k := APIKey{ID: "k" + hex.EncodeToString(idb), Name: name, MCPMaxCalls: mcpMaxCalls, EgressAllow: egressAllow}
	if k, err = s.insertAPIKey(ctx, k, key); err != nil {
		return APIKey{}, "", err
	}
	return k, key, nil
}

// insertAPIKey stores the hash of key with k's fields, created now, and
// returns k with its CreatedAt set.
func (s *Store) insertAPIKey(ctx context.Context, k APIKey, key string) (APIKey, error) {
	k.CreatedAt = time.Now().Truncate(time.Second)
	_, err := s.db.ExecContext(ctx, `INSERT INTO api_keys(id,name,hash,created_at,mcp_max_calls,egress_allow) VALUES(?,?,?,?,?,?)`,
		k.ID, k.Name, HashKey(key), k.CreatedAt.Unix(), k.MCPMaxCalls, encodeEgressAllow(k.EgressAllow))
	if err != nil {
		return APIKey{}, fmt.Errorf("store api key %s: %w", k.Name, err)
	}
	return k, nil
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
