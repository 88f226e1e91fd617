package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Volume is the durable record of one named volume. Names are unique within
// a team; the ID is unique on the daemon and names its directory.
type Volume struct {
	ID        string
	Name      string
	TeamID    string
	KeyID     string
	SizeBytes int64
	CreatedAt time.Time
	// Token is the volume's content token (E2B's VolumeAndToken.token, the
	// bearer of /volumecontent/{id}/*) as the volume manager seals it.
	// Empty for a volume made before tokens, until EnsureVolumeToken gives
	// it one.
	Token string
}

// ErrExists is returned when a record with the same unique key exists.
var ErrExists = errors.New("already exists")

const volumeCols = `id,name,team_id,key_id,size_bytes,created_at,token`

// PutVolume inserts a volume record; a name the team uses already is
// ErrExists.
func (s *Store) PutVolume(ctx context.Context, v Volume) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO volumes(`+volumeCols+`) VALUES(?,?,?,?,?,?,?)`,
		v.ID, v.Name, v.TeamID, v.KeyID, v.SizeBytes, v.CreatedAt.UnixMilli(), v.Token)
	if err != nil && strings.Contains(err.Error(), "UNIQUE") {
		return fmt.Errorf("store volume %s: %w", v.Name, ErrExists)
	}
	if err != nil {
		return fmt.Errorf("store volume %s: %w", v.Name, err)
	}
	return nil
}

func scanVolume(r scanner) (Volume, error) {
	var v Volume
	var created int64
	if err := r.Scan(&v.ID, &v.Name, &v.TeamID, &v.KeyID, &v.SizeBytes, &created, &v.Token); err != nil {
		return v, err
	}
	v.CreatedAt = time.UnixMilli(created)
	return v, nil
}

// GetVolume returns the team's volume called name, or ErrNotFound.
func (s *Store) GetVolume(ctx context.Context, team, name string) (Volume, error) {
	return getOne(s.db.QueryRowContext(ctx, `SELECT `+volumeCols+` FROM volumes WHERE team_id=? AND name=?`, team, name), scanVolume, "look up volume "+name)
}

// GetVolumeByID returns a volume by its ID, or ErrNotFound.
func (s *Store) GetVolumeByID(ctx context.Context, id string) (Volume, error) {
	return getOne(s.db.QueryRowContext(ctx, `SELECT `+volumeCols+` FROM volumes WHERE id=?`, id), scanVolume, "look up volume "+id)
}

// ListVolumes returns the team's volume records by name ("": every team's,
// by team and name).
func (s *Store) ListVolumes(ctx context.Context, team string) ([]Volume, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+volumeCols+` FROM volumes WHERE ?='' OR team_id=? ORDER BY team_id, name`, team, team)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	defer rows.Close()
	var out []Volume
	for rows.Next() {
		v, err := scanVolume(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// DeleteVolume removes a volume record by ID.
func (s *Store) DeleteVolume(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM volumes WHERE id=?`, id); err != nil {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	return nil
}

// EnsureVolumeToken gives the volume with this ID the token if it has none
// yet, and returns the token it has (the one given, or an older one a
// concurrent call stored first).
func (s *Store) EnsureVolumeToken(ctx context.Context, id, token string) (string, error) {
	if _, err := s.db.ExecContext(ctx, `UPDATE volumes SET token=? WHERE id=? AND token=''`, token, id); err != nil {
		return "", fmt.Errorf("set token of volume %s: %w", id, err)
	}
	v, err := s.GetVolumeByID(ctx, id)
	if err != nil {
		return "", err
	}
	return v.Token, nil
}
