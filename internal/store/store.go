// Package store keeps cella's durable state in one SQLite file: API keys
// (hashes only) and sandbox records. It is the source of truth that crash
// reconciliation compares against what the runtimes actually hold.
package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	_ "modernc.org/sqlite"

	"github.com/cella-sandbox/cella/internal/quota"
)

// ErrNotFound is returned when a record does not exist.
var ErrNotFound = errors.New("not found")

// Store is the SQLite-backed state of one daemon.
type Store struct {
	db *sql.DB
}

// Open opens (creating if needed) the database at path.
func Open(path string) (*Store, error) {
	dsn := "file:" + path + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// One writer at a time is what SQLite does anyway; a single connection
	// avoids SQLITE_BUSY storms under concurrent creates.
	db.SetMaxOpenConns(1)
	if err := migrate(context.Background(), db); err != nil { // migrate.go
		db.Close()
		return nil, fmt.Errorf("migrate %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// HashKey is how API keys are stored: never the key itself.
func HashKey(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

// APIKey is a stored key's public part.
type APIKey struct {
	ID   string
	Name string
	// TeamID is the team whose sandboxes the key shares; TeamName its name.
	TeamID    string
	TeamName  string
	CreatedAt time.Time
	// MCPMaxCalls is the tool-call budget of each MCP session opened with
	// this key (0 = the daemon's default).
	MCPMaxCalls int64
	// EgressAllow is the key's own egress ceiling, within the daemon's
	// (nil: the daemon's ceiling).
	EgressAllow []string
	// Secrets are the names of the secrets the key may attach to requests
	// or environments ("*": all); the admin key may use all.
	Secrets []string
	// Limits are the key's quota (zero fields: unlimited; the admin key is
	// always unlimited).
	Limits quota.Limits
}

// AddAPIKey stores the hash of key under name, in the admin team (the
// daemon's first key).
func (s *Store) AddAPIKey(ctx context.Context, id, name, key string) error {
	_, err := insertAPIKey(ctx, s.db, APIKey{ID: id, Name: name, TeamID: AdminTeamID}, key)
	return err
}

// CountAPIKeys returns how many keys exist.
func (s *Store) CountAPIKeys(ctx context.Context) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM api_keys`).Scan(&n)
	return n, err
}

// LookupAPIKey finds the key whose hash matches key.
func (s *Store) LookupAPIKey(ctx context.Context, key string) (APIKey, error) {
	return getOne(s.db.QueryRowContext(ctx, `SELECT `+keyCols+` FROM api_keys k LEFT JOIN teams t ON t.id=k.team_id WHERE k.hash=?`, HashKey(key)), scanKey, "look up api key")
}

// Sandbox is the durable record of one sandbox. Fields the daemon needs to
// query on are columns; the rest travels as JSON in Record.
type Sandbox struct {
	ID         string
	TemplateID string
	Runtime    string
	State      string
	StartedAt  time.Time
	EndAt      time.Time
	APIKeyID   string
	TeamID     string
	Record     json.RawMessage
}

// PutSandbox inserts or replaces a sandbox record.
func (s *Store) PutSandbox(ctx context.Context, sb Sandbox) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO sandboxes(id,template_id,runtime,state,started_at,end_at,api_key_id,team_id,record)
		VALUES(?,?,?,?,?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET template_id=excluded.template_id, runtime=excluded.runtime, state=excluded.state,
		started_at=excluded.started_at, end_at=excluded.end_at, api_key_id=excluded.api_key_id, team_id=excluded.team_id, record=excluded.record`,
		sb.ID, sb.TemplateID, sb.Runtime, sb.State, sb.StartedAt.UnixMilli(), sb.EndAt.UnixMilli(), sb.APIKeyID, sb.TeamID, string(sb.Record))
	if err != nil {
		return fmt.Errorf("store sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// GetSandbox returns one sandbox record.
func (s *Store) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	row := s.db.QueryRowContext(ctx, `SELECT id,template_id,runtime,state,started_at,end_at,api_key_id,team_id,record FROM sandboxes WHERE id=?`, id)
	sb, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return sb, ErrNotFound
	}
	return sb, err
}

// ListSandboxes returns every sandbox record, oldest first.
func (s *Store) ListSandboxes(ctx context.Context) ([]Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id,template_id,runtime,state,started_at,end_at,api_key_id,team_id,record FROM sandboxes ORDER BY started_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// DeleteSandbox removes a sandbox record.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id=?`, id)
	if err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return nil
}

type scanner interface{ Scan(...any) error }

// getOne scans the one row a query answered with scan: ErrNotFound when
// it answered none, any other error wrapped with what (e.g. "look up
// volume v1").
func getOne[T any](row *sql.Row, scan func(scanner) (T, error), what string) (T, error) {
	v, err := scan(row)
	if errors.Is(err, sql.ErrNoRows) {
		return v, ErrNotFound
	}
	if err != nil {
		return v, fmt.Errorf("%s: %w", what, err)
	}
	return v, nil
}

func scanSandbox(r scanner) (Sandbox, error) {
	var sb Sandbox
	var started, end int64
	var rec string
	if err := r.Scan(&sb.ID, &sb.TemplateID, &sb.Runtime, &sb.State, &started, &end, &sb.APIKeyID, &sb.TeamID, &rec); err != nil {
		return sb, err
	}
	sb.StartedAt = time.UnixMilli(started)
	sb.EndAt = time.UnixMilli(end)
	sb.Record = json.RawMessage(rec)
	return sb, nil
}

// PutSandboxOwner records who owns a sandbox. The row outlives the
// sandbox's record, so that its audit log stays its owner's until it is
// pruned (DeleteSandboxOwner).
func (s *Store) PutSandboxOwner(ctx context.Context, id, team, key string) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO sandbox_owners(sandbox_id,team_id,key_id,created_at) VALUES(?,?,?,?)
		ON CONFLICT(sandbox_id) DO UPDATE SET team_id=excluded.team_id, key_id=excluded.key_id`, id, team, key, time.Now().Unix())
	if err != nil {
		return fmt.Errorf("store owner of sandbox %s: %w", id, err)
	}
	return nil
}

// SandboxOwner returns the team and key that own a sandbox, or ErrNotFound.
func (s *Store) SandboxOwner(ctx context.Context, id string) (team, key string, err error) {
	err = s.db.QueryRowContext(ctx, `SELECT team_id,key_id FROM sandbox_owners WHERE sandbox_id=?`, id).Scan(&team, &key)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", ErrNotFound
	}
	if err != nil {
		return "", "", fmt.Errorf("look up owner of sandbox %s: %w", id, err)
	}
	return team, key, nil
}

// SandboxOwnerIDs lists the sandboxes whose owner is recorded.
func (s *Store) SandboxOwnerIDs(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT sandbox_id FROM sandbox_owners ORDER BY sandbox_id`)
	if err != nil {
		return nil, fmt.Errorf("list sandbox owners: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// DeleteSandboxOwner forgets who owned a sandbox (its audit log is gone).
func (s *Store) DeleteSandboxOwner(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM sandbox_owners WHERE sandbox_id=?`, id); err != nil {
		return fmt.Errorf("delete owner of sandbox %s: %w", id, err)
	}
	return nil
}
