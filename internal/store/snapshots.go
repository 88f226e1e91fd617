package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Snapshot is the durable record of one snapshot. Hidden snapshots are the
// ones fork makes for itself: they are never listed.
type Snapshot struct {
	ID         string
	SandboxID  string
	TemplateID string
	Name       string
	Hidden     bool
	CreatedAt  time.Time
	APIKeyID   string
	// TeamID owns it: only that team's keys (and the admin) see it.
	TeamID string
	Record json.RawMessage
}

// PutSnapshot inserts or replaces a snapshot record.
func (s *Store) PutSnapshot(ctx context.Context, sn Snapshot) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO snapshots(id,sandbox_id,template_id,name,hidden,created_at,api_key_id,team_id,record)
		VALUES(?,?,?,?,?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET sandbox_id=excluded.sandbox_id, template_id=excluded.template_id, name=excluded.name,
		hidden=excluded.hidden, created_at=excluded.created_at, api_key_id=excluded.api_key_id, team_id=excluded.team_id, record=excluded.record`,
		sn.ID, sn.SandboxID, sn.TemplateID, sn.Name, sn.Hidden, sn.CreatedAt.UnixMilli(), sn.APIKeyID, sn.TeamID, string(sn.Record))
	if err != nil {
		return fmt.Errorf("store snapshot %s: %w", sn.ID, err)
	}
	return nil
}

const snapshotCols = `id,sandbox_id,template_id,name,hidden,created_at,api_key_id,team_id,record`

// GetSnapshot returns a snapshot by ID, or by name when no ID matches. A
// name is looked up among team's snapshots only (names are per team; IDs
// are unique); team "" looks names up among all.
func (s *Store) GetSnapshot(ctx context.Context, team, idOrName string) (Snapshot, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE id=? OR (name=? AND name<>'' AND (?='' OR team_id=?))
		ORDER BY (id=?) DESC, created_at DESC LIMIT 1`, idOrName, idOrName, team, team, idOrName)
	sn, err := scanSnapshot(row)
	if errors.Is(err, sql.ErrNoRows) {
		return sn, ErrNotFound
	}
	return sn, err
}

// SnapshotFilter selects snapshots for ListSnapshots.
type SnapshotFilter struct {
	SandboxID     string
	Name          string
	IncludeHidden bool
	// TeamID, when set, lists only that team's snapshots.
	TeamID string
}

// ListSnapshots returns matching snapshots, newest first.
func (s *Store) ListSnapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, error) {
	q := `SELECT ` + snapshotCols + ` FROM snapshots WHERE 1=1`
	var args []any
	if !f.IncludeHidden {
		q += ` AND hidden=0`
	}
	if f.SandboxID != "" {
		q += ` AND sandbox_id=?`
		args = append(args, f.SandboxID)
	}
	if f.Name != "" {
		q += ` AND name=?`
		args = append(args, f.Name)
	}
	if f.TeamID != "" {
		q += ` AND team_id=?`
		args = append(args, f.TeamID)
	}
	q += ` ORDER BY created_at DESC, id`
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	defer rows.Close()
	var out []Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// DeleteSnapshot removes a snapshot record.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM snapshots WHERE id=?`, id); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	return nil
}

func scanSnapshot(r scanner) (Snapshot, error) {
	var sn Snapshot
	var created int64
	var rec string
	if err := r.Scan(&sn.ID, &sn.SandboxID, &sn.TemplateID, &sn.Name, &sn.Hidden, &created, &sn.APIKeyID, &sn.TeamID, &rec); err != nil {
		return sn, err
	}
	sn.CreatedAt = time.UnixMilli(created)
	sn.Record = json.RawMessage(rec)
	return sn, nil
}
