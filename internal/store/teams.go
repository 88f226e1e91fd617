package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// AdminTeamID is the team of the admin key (tenant.AdminTeam).
const AdminTeamID = "admin"

// Team is a group of API keys that share their sandboxes, snapshots and
// volumes (E2B's team).
type Team struct {
	ID        string
	Name      string
	CreatedAt time.Time
}

// TeamNameRe is what a team's name may be: E2B's slug characters.
var TeamNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// execQuerier is what both *sql.DB and *sql.Tx offer.
type execQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// insertTeam makes a team named after base (lower-cased, other characters
// replaced), with -2, -3, ... appended while the name is taken.
func insertTeam(ctx context.Context, db execQuerier, base string) (Team, error) {
	slug := teamSlug(base)
	id, err := newTeamID()
	if err != nil {
		return Team{}, err
	}
	now := time.Now().Truncate(time.Second)
	for i := 1; i < 1000; i++ {
		name := slug
		if i > 1 {
			name = fmt.Sprintf("%s-%d", strings.TrimRight(slug[:min(len(slug), 58)], "-._"), i)
		}
		_, err := db.ExecContext(ctx, `INSERT INTO teams(id,name,created_at) VALUES(?,?,?)`, id, name, now.Unix())
		if err == nil {
			return Team{ID: id, Name: name, CreatedAt: now}, nil
		}
		if !strings.Contains(err.Error(), "UNIQUE") {
			return Team{}, fmt.Errorf("store team %s: %w", name, err)
		}
	}
	return Team{}, fmt.Errorf("store team %s: no free name", slug)
}

func teamSlug(base string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(base) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	s := strings.TrimLeft(b.String(), "-._")
	if len(s) > 63 {
		s = s[:63]
	}
	if s == "" {
		s = "team"
	}
	return s
}

// teamByName returns the team called name, or ErrNotFound.
func teamByName(ctx context.Context, db execQuerier, name string) (Team, error) {
	return scanTeam(db.QueryRowContext(ctx, `SELECT id,name,created_at FROM teams WHERE name=?`, name), name)
}

// GetTeam returns a team by ID, or ErrNotFound.
func (s *Store) GetTeam(ctx context.Context, id string) (Team, error) {
	return scanTeam(s.db.QueryRowContext(ctx, `SELECT id,name,created_at FROM teams WHERE id=?`, id), id)
}

// scanTeam reads one team; what names the team asked for, for errors.
func scanTeam(r scanner, what string) (Team, error) {
	var t Team
	var created int64
	err := r.Scan(&t.ID, &t.Name, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return t, ErrNotFound
	}
	if err != nil {
		return t, fmt.Errorf("look up team %s: %w", what, err)
	}
	t.CreatedAt = time.Unix(created, 0)
	return t, nil
}

// ListTeams returns every team, oldest first.
func (s *Store) ListTeams(ctx context.Context) ([]Team, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id,name,created_at FROM teams ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list teams: %w", err)
	}
	defer rows.Close()
	var out []Team
	for rows.Next() {
		t, err := scanTeam(rows, "")
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}
