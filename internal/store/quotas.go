package store

import (
	"context"
	"fmt"

	"github.com/cella-sandbox/cella/internal/quota"
)

// GetAPIKey returns a key's public part by ID; ErrNotFound when unknown.
func (s *Store) GetAPIKey(ctx context.Context, id string) (APIKey, error) {
	k, err := getOne(s.db.QueryRowContext(ctx, `SELECT `+keyCols+` FROM api_keys k LEFT JOIN teams t ON t.id=k.team_id WHERE k.id=?`, id), scanKey, "read api key "+id)
	if err != nil {
		return APIKey{}, err
	}
	return k, nil
}

// SetKeyLimits replaces a key's quota and returns the key; ErrNotFound when
// unknown.
func (s *Store) SetKeyLimits(ctx context.Context, id string, l quota.Limits) (APIKey, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE api_keys SET max_sandboxes=?,max_vcpus=?,max_memory_mb=?,create_rate=?,request_rate=? WHERE id=?`,
		l.MaxSandboxes, l.MaxVCPUs, l.MaxMemoryMB, l.CreateRate.String(), l.RequestRate.String(), id)
	if err != nil {
		return APIKey{}, fmt.Errorf("update api key %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return APIKey{}, ErrNotFound
	}
	return s.GetAPIKey(ctx, id)
}
