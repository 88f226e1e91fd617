package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// migration is one step of the schema's history. Steps run in order, once
// each, in one transaction with the bump of PRAGMA user_version; the first
// steps are idempotent (IF NOT EXISTS, duplicate columns tolerated) because
// databases made before the list existed are at version 0 with some of
// them applied already.
type migration struct {
	name string
	run  func(ctx context.Context, tx *sql.Tx) error
}

// migrations is the schema's whole history; append only.
var migrations = []migration{
	{"keys and sandboxes", execSQL(`
CREATE TABLE IF NOT EXISTS api_keys (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL,
	hash       TEXT NOT NULL UNIQUE,
	created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sandboxes (
	id           TEXT PRIMARY KEY,
	template_id  TEXT NOT NULL,
	runtime      TEXT NOT NULL,
	state        TEXT NOT NULL,
	started_at   INTEGER NOT NULL,
	end_at       INTEGER NOT NULL,
	api_key_id   TEXT NOT NULL DEFAULT '',
	record       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sandboxes_state ON sandboxes(state);`)},
	{"pools", execSQL(`
CREATE TABLE IF NOT EXISTS pools (
	template   TEXT PRIMARY KEY,
	size       INTEGER NOT NULL,
	updated_at INTEGER NOT NULL
);`)},
	{"key budgets and ceilings", addColumns("api_keys",
		column{"mcp_max_calls", "INTEGER NOT NULL DEFAULT 0"},
		column{"egress_allow", "TEXT NOT NULL DEFAULT ''"})},
	{"snapshots", execSQL(`
CREATE TABLE IF NOT EXISTS snapshots (
	id          TEXT PRIMARY KEY,
	sandbox_id  TEXT NOT NULL,
	template_id TEXT NOT NULL,
	name        TEXT NOT NULL DEFAULT '',
	hidden      INTEGER NOT NULL DEFAULT 0,
	created_at  INTEGER NOT NULL,
	api_key_id  TEXT NOT NULL DEFAULT '',
	record      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS snapshots_sandbox ON snapshots(sandbox_id);
CREATE INDEX IF NOT EXISTS snapshots_name ON snapshots(name);`)},
	{"volumes", execSQL(`
CREATE TABLE IF NOT EXISTS volumes (
	name       TEXT PRIMARY KEY,
	size_bytes INTEGER NOT NULL,
	created_at INTEGER NOT NULL
);`)},
	{"secrets", migrateSecrets}, // secrets.go
	{"teams", migrateTeams},
	{"key quotas", addColumns("api_keys", // quotas.go
		column{"max_sandboxes", "INTEGER NOT NULL DEFAULT 0"},
		column{"max_vcpus", "INTEGER NOT NULL DEFAULT 0"},
		column{"max_memory_mb", "INTEGER NOT NULL DEFAULT 0"},
		column{"create_rate", "TEXT NOT NULL DEFAULT ''"},
		column{"request_rate", "TEXT NOT NULL DEFAULT ''"})},
	{"volume tokens", addColumns("volumes", column{"token", "TEXT NOT NULL DEFAULT ''"})},
	{"webhooks", execSQL(`
CREATE TABLE webhooks (
	id         TEXT PRIMARY KEY,
	team_id    TEXT NOT NULL,
	record     TEXT NOT NULL,
	created_at INTEGER NOT NULL
);
CREATE INDEX webhooks_team ON webhooks(team_id);
CREATE TABLE sandbox_events (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	id         TEXT NOT NULL UNIQUE,
	sandbox_id TEXT NOT NULL,
	team_id    TEXT NOT NULL,
	at         INTEGER NOT NULL,
	record     TEXT NOT NULL
);
CREATE INDEX sandbox_events_sandbox ON sandbox_events(sandbox_id, seq);
CREATE INDEX sandbox_events_at ON sandbox_events(at);`)}, // webhooks.go
	{"template builds", migrateTemplateBuilds}, // templatebuilds.go
	// templatebuilds.go: API templates the cluster has a record of
	{"cluster templates", addColumns("api_templates", column{"shared", "INTEGER NOT NULL DEFAULT 0"})},
}

// execSQL is a migration that runs statements.
func execSQL(stmts string) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, stmts)
		return err
	}
}

// column is a column a later cella added to a table: its name and its
// definition.
type column struct{ name, def string }

// addColumns adds cols to table, each unless it is there already (a
// database of an older cella that predates the migration list may have
// them).
func addColumns(table string, cols ...column) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		for _, col := range cols {
			_, err := tx.ExecContext(ctx, `ALTER TABLE `+table+` ADD COLUMN `+col.name+` `+col.def)
			if err != nil && !strings.Contains(err.Error(), "duplicate column") {
				return fmt.Errorf("add %s.%s: %w", table, col.name, err)
			}
		}
		return nil
	}
}

// migrate brings db to the newest schema.
func migrate(ctx context.Context, db *sql.DB) error {
	var version int
	if err := db.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&version); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if version > len(migrations) {
		return fmt.Errorf("the database is at schema version %d, newer than this cella knows (%d): use a newer cella", version, len(migrations))
	}
	for i := version; i < len(migrations); i++ {
		m := migrations[i]
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := m.run(ctx, tx); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %d (%s): %w", i+1, m.name, err)
		}
		// PRAGMA takes no parameters; i+1 is an integer of ours.
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, i+1)); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %d (%s): set version: %w", i+1, m.name, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migration %d (%s): commit: %w", i+1, m.name, err)
		}
	}
	return nil
}

// migrateTeams introduces teams and owners. Every existing key gets a team
// of its own (the admin key the admin team), every sandbox and snapshot the
// team of the key that made it, and volumes — keyed by name until now —
// get IDs (their old name, so their directories stay where they are) and
// the admin team. sandbox_owners keeps the owner of every sandbox whose
// audit log may outlive its record.
func migrateTeams(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, `
CREATE TABLE teams (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL UNIQUE,
	created_at INTEGER NOT NULL
);
ALTER TABLE api_keys ADD COLUMN team_id TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN secrets TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN team_id TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN team_id TEXT NOT NULL DEFAULT '';
CREATE INDEX snapshots_team_name ON snapshots(team_id, name);
CREATE TABLE volumes_v2 (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL,
	team_id    TEXT NOT NULL,
	key_id     TEXT NOT NULL DEFAULT '',
	size_bytes INTEGER NOT NULL,
	created_at INTEGER NOT NULL,
	UNIQUE(team_id, name)
);
INSERT INTO volumes_v2(id,name,team_id,key_id,size_bytes,created_at)
	SELECT name, name, 'admin', 'admin', size_bytes, created_at FROM volumes;
DROP TABLE volumes;
ALTER TABLE volumes_v2 RENAME TO volumes;
CREATE TABLE sandbox_owners (
	sandbox_id TEXT PRIMARY KEY,
	team_id    TEXT NOT NULL,
	key_id     TEXT NOT NULL,
	created_at INTEGER NOT NULL
);
INSERT INTO teams(id,name,created_at) VALUES('admin','admin',`+fmt.Sprint(time.Now().Unix())+`);`); err != nil {
		return err
	}
	rows, err := tx.QueryContext(ctx, `SELECT id, name FROM api_keys`)
	if err != nil {
		return err
	}
	type key struct{ id, name string }
	var keys []key
	for rows.Next() {
		var k key
		if err := rows.Scan(&k.id, &k.name); err != nil {
			rows.Close()
			return err
		}
		keys = append(keys, k)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, k := range keys {
		team := AdminTeamID
		if k.id != AdminKeyID {
			t, err := insertTeam(ctx, tx, k.name)
			if err != nil {
				return err
			}
			team = t.ID
		}
		if _, err := tx.ExecContext(ctx, `UPDATE api_keys SET team_id=? WHERE id=?`, team, k.id); err != nil {
			return err
		}
	}
	// Sandboxes and snapshots of a deleted key belong to the admin.
	for _, table := range []string{"sandboxes", "snapshots"} {
		if _, err := tx.ExecContext(ctx, `UPDATE `+table+` SET team_id=COALESCE((SELECT team_id FROM api_keys WHERE api_keys.id=`+table+`.api_key_id), 'admin')`); err != nil {
			return err
		}
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO sandbox_owners(sandbox_id,team_id,key_id,created_at) SELECT id, team_id, api_key_id, started_at/1000 FROM sandboxes`)
	return err
}

// newTeamID is "t" and 12 hex digits.
func newTeamID() (string, error) {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate team id: %w", err)
	}
	return "t" + hex.EncodeToString(b), nil
}
