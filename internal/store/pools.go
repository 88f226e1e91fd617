package store

import (
	"context"
	"fmt"
	"time"
)

// PoolSize is the warm-pool size of one template as set through the API
// (PUT /pools/{template}); 0 is kept too: it overrides a --pool flag.
type PoolSize struct {
	Template  string
	Size      int
	UpdatedAt time.Time
}

// PutPoolSize records a template's pool size, replacing an earlier one.
func (s *Store) PutPoolSize(ctx context.Context, p PoolSize) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO pools(template,size,updated_at) VALUES(?,?,?)
		ON CONFLICT(template) DO UPDATE SET size=excluded.size, updated_at=excluded.updated_at`,
		p.Template, p.Size, p.UpdatedAt.UnixMilli())
	if err != nil {
		return fmt.Errorf("store pool size of %s: %w", p.Template, err)
	}
	return nil
}

// ListPoolSizes returns every recorded pool size, by template.
func (s *Store) ListPoolSizes(ctx context.Context) ([]PoolSize, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT template,size,updated_at FROM pools ORDER BY template`)
	if err != nil {
		return nil, fmt.Errorf("list pool sizes: %w", err)
	}
	defer rows.Close()
	var out []PoolSize
	for rows.Next() {
		var p PoolSize
		var updated int64
		if err := rows.Scan(&p.Template, &p.Size, &updated); err != nil {
			return nil, err
		}
		p.UpdatedAt = time.UnixMilli(updated)
		out = append(out, p)
	}
	return out, rows.Err()
}
