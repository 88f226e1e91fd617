package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Volume is the durable record of one named volume.
type Volume struct {
	Name      string
	SizeBytes int64
	CreatedAt time.Time
}

const volumesSchema = `
CREATE TABLE IF NOT EXISTS volumes (
	name       TEXT PRIMARY KEY,
	size_bytes INTEGER NOT NULL,
	created_at INTEGER NOT NULL
);
`

// InitVolumes creates the volumes table if it does not exist yet. The
// volume manager calls it once at start.
func (s *Store) InitVolumes(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, volumesSchema); err != nil {
		return fmt.Errorf("init volumes table: %w", err)
	}
	return nil
}

// PutVolume inserts a volume record; an existing name is an error.
func (s *Store) PutVolume(ctx context.Context, v Volume) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO volumes(name,size_bytes,created_at) VALUES(?,?,?)`,
		v.Name, v.SizeBytes, v.CreatedAt.UnixMilli())
	if err != nil {
		return fmt.Errorf("store volume %s: %w", v.Name, err)
	}
	return nil
}

// GetVolume returns one volume record, or ErrNotFound.
func (s *Store) GetVolume(ctx context.Context, name string) (Volume, error) {
	var v Volume
	var created int64
	err := s.db.QueryRowContext(ctx, `SELECT name,size_bytes,created_at FROM volumes WHERE name=?`, name).
		Scan(&v.Name, &v.SizeBytes, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return v, ErrNotFound
	}
	if err != nil {
		return v, fmt.Errorf("look up volume %s: %w", name, err)
	}
	v.CreatedAt = time.UnixMilli(created)
	return v, nil
}

// ListVolumes returns every volume record, by name.
func (s *Store) ListVolumes(ctx context.Context) ([]Volume, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name,size_bytes,created_at FROM volumes ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	defer rows.Close()
	var out []Volume
	for rows.Next() {
		var v Volume
		var created int64
		if err := rows.Scan(&v.Name, &v.SizeBytes, &created); err != nil {
			return nil, err
		}
		v.CreatedAt = time.UnixMilli(created)
		out = append(out, v)
	}
	return out, rows.Err()
}

// DeleteVolume removes a volume record.
func (s *Store) DeleteVolume(ctx context.Context, name string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM volumes WHERE name=?`, name); err != nil {
		return fmt.Errorf("delete volume %s: %w", name, err)
	}
	return nil
}
