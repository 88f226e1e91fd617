package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Secret is the durable record of one secret. Only the ciphertext of the
// current value is stored: an update replaces it, so Version counts the
// values a secret has had but older ones cannot be read back. The master
// key that opens the ciphertext lives outside the database.
type Secret struct {
	ID         string
	Name       string
	Ciphertext []byte
	Version    int64
	// Metadata is the caller's labels: stored and returned in plaintext, so
	// it must never hold anything secret.
	Metadata  map[string]string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// ErrSecretExists is returned by CreateSecret for a name already taken.
var ErrSecretExists = errors.New("secret already exists")

// SecretIDPrefix starts every secret ID; names may not start with it, so a
// path segment is unambiguously an ID or a name.
const SecretIDPrefix = "sec_"

const secretIDChars = "0123456789abcdefghijklmnopqrstuvwxyz"

// NewSecretID returns a random ID: "sec_" and 20 lowercase letters and
// digits (about 103 bits).
func NewSecretID() (string, error) {
	const n = 20
	out := make([]byte, 0, n)
	buf := make([]byte, 32)
	for len(out) < n {
		if _, err := rand.Read(buf); err != nil {
			return "", fmt.Errorf("generate secret id: %w", err)
		}
		for _, b := range buf {
			// 252 = 7*36: dropping the bytes above keeps every character
			// equally likely.
			if b < 252 && len(out) < n {
				out = append(out, secretIDChars[b%36])
			}
		}
	}
	return SecretIDPrefix + string(out), nil
}

// migrateSecrets makes the secrets table, and brings a table of an older
// cella up to date: the id, version and metadata columns came after its
// first release, and secrets stored before IDs existed get one.
func migrateSecrets(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, `
CREATE TABLE IF NOT EXISTS secrets (
	name       TEXT PRIMARY KEY,
	ciphertext BLOB NOT NULL,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	id         TEXT,
	version    INTEGER NOT NULL DEFAULT 1,
	metadata   TEXT NOT NULL DEFAULT '{}'
);`); err != nil {
		return err
	}
	if err := addColumns("secrets",
		column{"id", "TEXT"},
		column{"version", "INTEGER NOT NULL DEFAULT 1"},
		column{"metadata", "TEXT NOT NULL DEFAULT '{}'"})(ctx, tx); err != nil {
		return err
	}
	rows, err := tx.QueryContext(ctx, `SELECT name FROM secrets WHERE id IS NULL OR id = ''`)
	if err != nil {
		return fmt.Errorf("find secrets without id: %w", err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return fmt.Errorf("find secrets without id: %w", err)
		}
		names = append(names, n)
	}
	// Closed before the updates: the store has a single connection.
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("find secrets without id: %w", err)
	}
	for _, n := range names {
		id, err := NewSecretID()
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE secrets SET id=? WHERE name=?`, id, n); err != nil {
			return fmt.Errorf("assign an id to secret %s: %w", n, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `CREATE UNIQUE INDEX IF NOT EXISTS secrets_id ON secrets(id)`); err != nil {
		return fmt.Errorf("index secrets.id: %w", err)
	}
	return nil
}

// CreateSecret inserts a new secret; a taken name is ErrSecretExists.
func (s *Store) CreateSecret(ctx context.Context, sec Secret) error {
	md, err := encodeMetadata(sec.Metadata)
	if err != nil {
		return fmt.Errorf("store secret %s: %w", sec.Name, err)
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO secrets(id,name,ciphertext,version,metadata,created_at,updated_at) VALUES(?,?,?,?,?,?,?)`,
		sec.ID, sec.Name, sec.Ciphertext, sec.Version, md, sec.CreatedAt.UnixMilli(), sec.UpdatedAt.UnixMilli())
	if err != nil {
		if strings.Contains(err.Error(), "UNIQUE constraint failed: secrets.name") {
			return ErrSecretExists
		}
		return fmt.Errorf("store secret %s: %w", sec.Name, err)
	}
	return nil
}

// UpdateSecret replaces the value, version, metadata and update time of the
// secret sec.ID; it reports ErrNotFound for an unknown ID.
func (s *Store) UpdateSecret(ctx context.Context, sec Secret) error {
	md, err := encodeMetadata(sec.Metadata)
	if err != nil {
		return fmt.Errorf("update secret %s: %w", sec.Name, err)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE secrets SET ciphertext=?, version=?, metadata=?, updated_at=? WHERE id=?`,
		sec.Ciphertext, sec.Version, md, sec.UpdatedAt.UnixMilli(), sec.ID)
	if err != nil {
		return fmt.Errorf("update secret %s: %w", sec.Name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

const secretColumns = `id,name,ciphertext,version,metadata,created_at,updated_at`

// GetSecret returns one secret record by name, or ErrNotFound.
func (s *Store) GetSecret(ctx context.Context, name string) (Secret, error) {
	return getOne(s.db.QueryRowContext(ctx, `SELECT `+secretColumns+` FROM secrets WHERE name=?`, name), scanSecret, "look up secret "+name)
}

// ListSecrets returns every secret record, by name.
func (s *Store) ListSecrets(ctx context.Context) ([]Secret, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+secretColumns+` FROM secrets ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	defer rows.Close()
	var out []Secret
	for rows.Next() {
		sec, err := scanSecret(rows)
		if err != nil {
			return nil, fmt.Errorf("list secrets: %w", err)
		}
		out = append(out, sec)
	}
	return out, rows.Err()
}

// DeleteSecret removes the secret with this ID; it reports ErrNotFound for
// an unknown one.
func (s *Store) DeleteSecret(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM secrets WHERE id=?`, id)
	if err != nil {
		return fmt.Errorf("delete secret %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

func encodeMetadata(md map[string]string) (string, error) {
	if len(md) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(md)
	if err != nil {
		return "", fmt.Errorf("encode metadata: %w", err)
	}
	return string(b), nil
}

func scanSecret(r scanner) (Secret, error) {
	var sec Secret
	var created, updated int64
	var md string
	if err := r.Scan(&sec.ID, &sec.Name, &sec.Ciphertext, &sec.Version, &md, &created, &updated); err != nil {
		return sec, err
	}
	sec.Metadata = map[string]string{}
	if err := json.Unmarshal([]byte(md), &sec.Metadata); err != nil {
		return sec, fmt.Errorf("secret %s: decode metadata: %w", sec.Name, err)
	}
	sec.CreatedAt = time.UnixMilli(created)
	sec.UpdatedAt = time.UnixMilli(updated)
	return sec, nil
}
