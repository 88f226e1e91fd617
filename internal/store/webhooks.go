package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Webhook is a team's subscription to sandbox lifecycle events (E2B's
// /events/webhooks). Its signing secret is stored sealed under the
// daemon's master key (internal/secrets Box); the API never shows it.
type Webhook struct {
	ID           string    `json:"id"`
	TeamID       string    `json:"teamID"`
	Name         string    `json:"name"`
	URL          string    `json:"url"`
	Events       []string  `json:"events"`
	Enabled      bool      `json:"enabled"`
	SealedSecret []byte    `json:"sealedSecret"`
	CreatedAt    time.Time `json:"createdAt"`
}

// PutWebhook inserts or replaces a webhook.
func (s *Store) PutWebhook(ctx context.Context, w Webhook) error {
	rec, err := json.Marshal(w)
	if err != nil {
		return fmt.Errorf("encode webhook %s: %w", w.ID, err)
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO webhooks(id,team_id,record,created_at) VALUES(?,?,?,?)
ON CONFLICT(id) DO UPDATE SET record=excluded.record`, w.ID, w.TeamID, string(rec), w.CreatedAt.UnixMilli())
	if err != nil {
		return fmt.Errorf("store webhook %s: %w", w.ID, err)
	}
	return nil
}

func scanWebhook(r scanner) (Webhook, error) {
	var rec string
	var w Webhook
	if err := r.Scan(&rec); err != nil {
		return w, err
	}
	if err := json.Unmarshal([]byte(rec), &w); err != nil {
		return w, fmt.Errorf("decode webhook: %w", err)
	}
	return w, nil
}

// GetWebhook returns the team's webhook with this ID, or ErrNotFound
// (team "": any team's).
func (s *Store) GetWebhook(ctx context.Context, team, id string) (Webhook, error) {
	return getOne(s.db.QueryRowContext(ctx, `SELECT record FROM webhooks WHERE id=? AND (?='' OR team_id=?)`, id, team, team), scanWebhook, "look up webhook "+id)
}

// ListWebhooks returns the team's webhooks, oldest first ("": every team's).
func (s *Store) ListWebhooks(ctx context.Context, team string) ([]Webhook, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT record FROM webhooks WHERE ?='' OR team_id=? ORDER BY created_at, id`, team, team)
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", err)
	}
	defer rows.Close()
	out := []Webhook{}
	for rows.Next() {
		w, err := scanWebhook(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, rows.Err()
}

// DeleteWebhook removes the team's webhook; ErrNotFound if it has none of
// this ID (team "": any team's).
func (s *Store) DeleteWebhook(ctx context.Context, team, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM webhooks WHERE id=? AND (?='' OR team_id=?)`, id, team, team)
	if err != nil {
		return fmt.Errorf("delete webhook %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// SandboxEvent is a stored lifecycle event: its E2B JSON (Record) and what
// it is looked up by.
type SandboxEvent struct {
	ID        string
	SandboxID string
	TeamID    string
	At        time.Time
	Record    json.RawMessage
}

// PutSandboxEvent appends an event.
func (s *Store) PutSandboxEvent(ctx context.Context, e SandboxEvent) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO sandbox_events(id,sandbox_id,team_id,at,record) VALUES(?,?,?,?,?)`,
		e.ID, e.SandboxID, e.TeamID, e.At.UnixMilli(), string(e.Record))
	if err != nil {
		return fmt.Errorf("store event %s: %w", e.ID, err)
	}
	return nil
}

// EventQuery selects stored events: of one sandbox (or all), of one team
// (or all), a page in order of arrival.
type EventQuery struct {
	SandboxID string // "": every sandbox
	TeamID    string // "": every team
	Offset    int
	Limit     int
	Ascending bool
}

// SandboxEvents returns the events q selects.
func (s *Store) SandboxEvents(ctx context.Context, q EventQuery) ([]json.RawMessage, error) {
	order := "DESC"
	if q.Ascending {
		order = "ASC"
	}
	rows, err := s.db.QueryContext(ctx, `SELECT record FROM sandbox_events
WHERE (?='' OR sandbox_id=?) AND (?='' OR team_id=?) ORDER BY seq `+order+` LIMIT ? OFFSET ?`,
		q.SandboxID, q.SandboxID, q.TeamID, q.TeamID, q.Limit, q.Offset)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	defer rows.Close()
	out := []json.RawMessage{}
	for rows.Next() {
		var rec string
		if err := rows.Scan(&rec); err != nil {
			return nil, err
		}
		out = append(out, json.RawMessage(rec))
	}
	return out, rows.Err()
}

// PruneSandboxEvents removes events older than before.
func (s *Store) PruneSandboxEvents(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM sandbox_events WHERE at < ?`, before.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("prune events: %w", err)
	}
	return res.RowsAffected()
}
