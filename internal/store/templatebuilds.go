package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The state of E2B's template build API (internal/builds): templates made
// over the API with their owning team, aliases and public flag; their
// builds with status, reason and log; tags naming builds.

// APITemplate is a template made over the API: E2B's template ID and alias
// (unique on the daemon), its owner and whether it is public.
type APITemplate struct {
	ID        string
	Alias     string
	TeamID    string
	KeyID     string
	Public    bool
	CreatedAt time.Time
	UpdatedAt time.Time
	// Shared: the cluster has a record of it (a cluster node's build or
	// pull).
	Shared bool
}

// Build is one build of an API template. StoreName is the template-store
// name the build installs (unique per build); Tags are assigned to it when
// it is ready.
type Build struct {
	ID         string
	TemplateID string
	Status     string // waiting, building, ready, error
	Tags       []string
	StoreName  string
	CPUCount   int
	MemoryMB   int
	KeyID      string
	Reason     string
	ReasonStep string
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt time.Time
}

// BuildLog is one line of a build's log; Seq counts from 0.
type BuildLog struct {
	Seq     int
	Time    time.Time
	Level   string
	Message string
	Step    string
}

// Tag names one build of a template.
type Tag struct {
	Tag       string
	BuildID   string
	CreatedAt time.Time
}

func migrateTemplateBuilds(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `
CREATE TABLE api_templates (
	id         TEXT PRIMARY KEY,
	alias      TEXT NOT NULL UNIQUE,
	team_id    TEXT NOT NULL,
	key_id     TEXT NOT NULL,
	public     INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL
);
CREATE TABLE template_builds (
	id          TEXT PRIMARY KEY,
	template_id TEXT NOT NULL,
	status      TEXT NOT NULL,
	tags        TEXT NOT NULL DEFAULT '',
	store_name  TEXT NOT NULL UNIQUE,
	cpu_count   INTEGER NOT NULL,
	memory_mb   INTEGER NOT NULL,
	key_id      TEXT NOT NULL,
	reason      TEXT NOT NULL DEFAULT '',
	reason_step TEXT NOT NULL DEFAULT '',
	created_at  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL,
	finished_at INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX template_builds_template ON template_builds(template_id);
CREATE INDEX template_builds_status ON template_builds(status);
CREATE TABLE template_build_logs (
	build_id TEXT NOT NULL,
	seq      INTEGER NOT NULL,
	at       INTEGER NOT NULL,
	level    TEXT NOT NULL,
	message  TEXT NOT NULL,
	step     TEXT NOT NULL DEFAULT '',
	PRIMARY KEY(build_id, seq)
) WITHOUT ROWID;
CREATE TABLE template_tags (
	template_id TEXT NOT NULL,
	tag         TEXT NOT NULL,
	build_id    TEXT NOT NULL,
	created_at  INTEGER NOT NULL,
	PRIMARY KEY(template_id, tag)
);`)
	return err
}

const apiTemplateCols = `id,alias,team_id,key_id,public,created_at,updated_at,shared`

// PutAPITemplate inserts a template; an alias or ID in use is ErrExists.
func (s *Store) PutAPITemplate(ctx context.Context, t APITemplate) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO api_templates(`+apiTemplateCols+`) VALUES(?,?,?,?,?,?,?,?)`,
		t.ID, t.Alias, t.TeamID, t.KeyID, t.Public, t.CreatedAt.UnixMilli(), t.UpdatedAt.UnixMilli(), t.Shared)
	if err != nil && strings.Contains(err.Error(), "UNIQUE") {
		return fmt.Errorf("store template %s: %w", t.Alias, ErrExists)
	}
	if err != nil {
		return fmt.Errorf("store template %s: %w", t.Alias, err)
	}
	return nil
}

func scanAPITemplate(r scanner) (APITemplate, error) {
	var t APITemplate
	var created, updated int64
	if err := r.Scan(&t.ID, &t.Alias, &t.TeamID, &t.KeyID, &t.Public, &created, &updated, &t.Shared); err != nil {
		return t, err
	}
	t.CreatedAt, t.UpdatedAt = time.UnixMilli(created), time.UnixMilli(updated)
	return t, nil
}

func (s *Store) getAPITemplate(ctx context.Context, where, arg string) (APITemplate, error) {
	return getOne(s.db.QueryRowContext(ctx, `SELECT `+apiTemplateCols+` FROM api_templates WHERE `+where+`=?`, arg), scanAPITemplate, "look up template "+arg)
}

// GetAPITemplate returns the template with this ID, or ErrNotFound.
func (s *Store) GetAPITemplate(ctx context.Context, id string) (APITemplate, error) {
	return s.getAPITemplate(ctx, "id", id)
}

// GetAPITemplateByAlias returns the template with this alias, or ErrNotFound.
func (s *Store) GetAPITemplateByAlias(ctx context.Context, alias string) (APITemplate, error) {
	return s.getAPITemplate(ctx, "alias", alias)
}

// ListAPITemplates returns every API template, oldest first.
func (s *Store) ListAPITemplates(ctx context.Context) ([]APITemplate, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+apiTemplateCols+` FROM api_templates ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	defer rows.Close()
	var out []APITemplate
	for rows.Next() {
		t, err := scanAPITemplate(rows)
		if err != nil {
			return nil, fmt.Errorf("list templates: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// SetAPITemplateShared marks a template as the cluster's: it has a
// Template record (internal/builds' shared.go), and a copy whose record is
// gone is dropped.
func (s *Store) SetAPITemplateShared(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE api_templates SET shared=1 WHERE id=?`, id)
	if err != nil {
		return fmt.Errorf("mark template %s shared: %w", id, err)
	}
	return mustAffect(res, id)
}

// SetAPITemplatePublic publishes or unpublishes a template.
func (s *Store) SetAPITemplatePublic(ctx context.Context, id string, public bool) error {
	res, err := s.db.ExecContext(ctx, `UPDATE api_templates SET public=?, updated_at=? WHERE id=?`, public, time.Now().UnixMilli(), id)
	if err != nil {
		return fmt.Errorf("publish template %s: %w", id, err)
	}
	return mustAffect(res, id)
}

// DeleteAPITemplate removes a template with its builds, logs and tags.
func (s *Store) DeleteAPITemplate(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, q := range []string{
		`DELETE FROM template_build_logs WHERE build_id IN (SELECT id FROM template_builds WHERE template_id=?)`,
		`DELETE FROM template_builds WHERE template_id=?`,
		`DELETE FROM template_tags WHERE template_id=?`,
		`DELETE FROM api_templates WHERE id=?`,
	} {
		if _, err := tx.ExecContext(ctx, q, id); err != nil {
			return fmt.Errorf("delete template %s: %w", id, err)
		}
	}
	return tx.Commit()
}

const buildCols = `id,template_id,status,tags,store_name,cpu_count,memory_mb,key_id,reason,reason_step,created_at,updated_at,finished_at`

// PutBuild inserts a build.
func (s *Store) PutBuild(ctx context.Context, b Build) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO template_builds(`+buildCols+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		b.ID, b.TemplateID, b.Status, strings.Join(b.Tags, ","), b.StoreName, b.CPUCount, b.MemoryMB, b.KeyID,
		b.Reason, b.ReasonStep, b.CreatedAt.UnixMilli(), b.UpdatedAt.UnixMilli(), unixMilliOrZero(b.FinishedAt))
	if err != nil {
		return fmt.Errorf("store build %s: %w", b.ID, err)
	}
	return nil
}

func unixMilliOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func scanBuild(r scanner) (Build, error) {
	var b Build
	var tags string
	var created, updated, finished int64
	if err := r.Scan(&b.ID, &b.TemplateID, &b.Status, &tags, &b.StoreName, &b.CPUCount, &b.MemoryMB, &b.KeyID,
		&b.Reason, &b.ReasonStep, &created, &updated, &finished); err != nil {
		return b, err
	}
	if tags != "" {
		b.Tags = strings.Split(tags, ",")
	}
	b.CreatedAt, b.UpdatedAt = time.UnixMilli(created), time.UnixMilli(updated)
	if finished != 0 {
		b.FinishedAt = time.UnixMilli(finished)
	}
	return b, nil
}

// GetBuild returns a build, or ErrNotFound.
func (s *Store) GetBuild(ctx context.Context, id string) (Build, error) {
	return getOne(s.db.QueryRowContext(ctx, `SELECT `+buildCols+` FROM template_builds WHERE id=?`, id), scanBuild, "look up build "+id)
}

// GetBuildByStoreName returns the build that installs this template-store
// name, or ErrNotFound.
func (s *Store) GetBuildByStoreName(ctx context.Context, name string) (Build, error) {
	return getOne(s.db.QueryRowContext(ctx, `SELECT `+buildCols+` FROM template_builds WHERE store_name=?`, name), scanBuild, "look up build of "+name)
}

// ListBuilds returns a template's builds, oldest first.
func (s *Store) ListBuilds(ctx context.Context, templateID string) ([]Build, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+buildCols+` FROM template_builds WHERE template_id=? ORDER BY created_at, id`, templateID)
	if err != nil {
		return nil, fmt.Errorf("list builds of %s: %w", templateID, err)
	}
	defer rows.Close()
	var out []Build
	for rows.Next() {
		b, err := scanBuild(rows)
		if err != nil {
			return nil, fmt.Errorf("list builds of %s: %w", templateID, err)
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// SetBuildStatus moves a build from one of the statuses in from to status
// (with a reason for "error"); ErrNotFound when the build is not in one of
// them (already started, finished or gone).
func (s *Store) SetBuildStatus(ctx context.Context, id string, from []string, status, reason, step string) error {
	now := time.Now().UnixMilli()
	finished := int64(0)
	if status == "ready" || status == "error" {
		finished = now
	}
	q := `UPDATE template_builds SET status=?, reason=?, reason_step=?, updated_at=?, finished_at=? WHERE id=? AND status IN (?` +
		strings.Repeat(",?", len(from)-1) + `)`
	args := []any{status, reason, step, now, finished, id}
	for _, f := range from {
		args = append(args, f)
	}
	res, err := s.db.ExecContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("set build %s %s: %w", id, status, err)
	}
	return mustAffect(res, id)
}

// FailBuilds turns every build in one of the statuses in from to "error"
// with reason (a daemon that restarted: its builds in progress died with
// it); the IDs of the builds changed. templateID "" means every template.
func (s *Store) FailBuilds(ctx context.Context, templateID string, from []string, except, reason string) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id FROM template_builds WHERE (?='' OR template_id=?) AND id<>? AND status IN (?`+
		strings.Repeat(",?", len(from)-1)+`)`, append([]any{templateID, templateID, except}, anySlice(from)...)...)
	if err != nil {
		return nil, fmt.Errorf("find builds to fail: %w", err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var failed []string
	for _, id := range ids {
		if err := s.SetBuildStatus(ctx, id, from, "error", reason, ""); err == nil {
			failed = append(failed, id)
		} else if !errors.Is(err, ErrNotFound) {
			return failed, err
		}
	}
	return failed, nil
}

func anySlice(in []string) []any {
	out := make([]any, len(in))
	for i, s := range in {
		out[i] = s
	}
	return out
}

func mustAffect(res sql.Result, id string) error {
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%s: %w", id, ErrNotFound)
	}
	return nil
}

// AppendBuildLogs adds log lines (their Seq set by the caller, contiguous
// from the current count) in one transaction.
func (s *Store) AppendBuildLogs(ctx context.Context, buildID string, logs []BuildLog) error {
	if len(logs) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	st, err := tx.PrepareContext(ctx, `INSERT INTO template_build_logs(build_id,seq,at,level,message,step) VALUES(?,?,?,?,?,?)`)
	if err != nil {
		return err
	}
	defer st.Close()
	for _, l := range logs {
		if _, err := st.ExecContext(ctx, buildID, l.Seq, l.Time.UnixMilli(), l.Level, l.Message, l.Step); err != nil {
			return fmt.Errorf("store log of build %s: %w", buildID, err)
		}
	}
	return tx.Commit()
}

// BuildLogs returns up to limit log lines of a build from offset on.
func (s *Store) BuildLogs(ctx context.Context, buildID string, offset, limit int) ([]BuildLog, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT seq,at,level,message,step FROM template_build_logs WHERE build_id=? AND seq>=? ORDER BY seq LIMIT ?`,
		buildID, offset, limit)
	if err != nil {
		return nil, fmt.Errorf("read log of build %s: %w", buildID, err)
	}
	defer rows.Close()
	var out []BuildLog
	for rows.Next() {
		var l BuildLog
		var at int64
		if err := rows.Scan(&l.Seq, &at, &l.Level, &l.Message, &l.Step); err != nil {
			return nil, fmt.Errorf("read log of build %s: %w", buildID, err)
		}
		l.Time = time.UnixMilli(at).UTC()
		out = append(out, l)
	}
	return out, rows.Err()
}

// CountBuildLogs is the number of log lines a build has.
func (s *Store) CountBuildLogs(ctx context.Context, buildID string) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM template_build_logs WHERE build_id=?`, buildID).Scan(&n)
	return n, err
}

// SetTag points a template's tag at a build (moving it if it named another).
func (s *Store) SetTag(ctx context.Context, templateID, tag, buildID string) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO template_tags(template_id,tag,build_id,created_at) VALUES(?,?,?,?)
ON CONFLICT(template_id,tag) DO UPDATE SET build_id=excluded.build_id, created_at=excluded.created_at`,
		templateID, tag, buildID, time.Now().UnixMilli())
	if err != nil {
		return fmt.Errorf("tag %s:%s: %w", templateID, tag, err)
	}
	return nil
}

// DeleteTag removes a tag; ErrNotFound if the template has no such tag.
func (s *Store) DeleteTag(ctx context.Context, templateID, tag string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM template_tags WHERE template_id=? AND tag=?`, templateID, tag)
	if err != nil {
		return fmt.Errorf("untag %s:%s: %w", templateID, tag, err)
	}
	return mustAffect(res, templateID+":"+tag)
}

// GetTag returns the build a tag names, or ErrNotFound.
func (s *Store) GetTag(ctx context.Context, templateID, tag string) (Tag, error) {
	var t Tag
	var created int64
	err := s.db.QueryRowContext(ctx, `SELECT tag,build_id,created_at FROM template_tags WHERE template_id=? AND tag=?`, templateID, tag).
		Scan(&t.Tag, &t.BuildID, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return t, ErrNotFound
	}
	if err != nil {
		return t, fmt.Errorf("look up tag %s:%s: %w", templateID, tag, err)
	}
	t.CreatedAt = time.UnixMilli(created)
	return t, nil
}

// ListTags returns a template's tags by name.
func (s *Store) ListTags(ctx context.Context, templateID string) ([]Tag, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT tag,build_id,created_at FROM template_tags WHERE template_id=? ORDER BY tag`, templateID)
	if err != nil {
		return nil, fmt.Errorf("list tags of %s: %w", templateID, err)
	}
	defer rows.Close()
	var out []Tag
	for rows.Next() {
		var t Tag
		var created int64
		if err := rows.Scan(&t.Tag, &t.BuildID, &created); err != nil {
			return nil, err
		}
		t.CreatedAt = time.UnixMilli(created)
		out = append(out, t)
	}
	return out, rows.Err()
}
