package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/cella-sandbox/cella/internal/apiwire"
)

// Pool is one template's warm pool (GET /pools).
type Pool = apiwire.Pool

// ListPools returns every warm pool.
func (c *Client) ListPools(ctx context.Context) ([]Pool, error) {
	var ps []Pool
	_, err := c.do(ctx, http.MethodGet, "/pools", nil, &ps)
	return ps, err
}

// SetPool sets a template's warm-pool size (admin key; 0 removes the pool).
func (c *Client) SetPool(ctx context.Context, template string, size int) (Pool, error) {
	var p Pool
	_, err := c.do(ctx, http.MethodPut, "/pools/"+url.PathEscape(template), apiwire.PoolSize{Size: size}, &p)
	return p, err
}
