package client

import (
	"context"
	"net/http"
	"net/url"
)

// Pool is one template's warm pool (GET /pools).
type Pool struct {
	Template  string `json:"template"`
	Size      int    `json:"size"`
	Ready     int    `json:"ready"`
	Filling   int    `json:"filling"`
	HandedOut int64  `json:"handedOut"`
	Misses    int64  `json:"misses"`
	LastError string `json:"lastError"`
}

// ListPools returns every warm pool.
func (c *Client) ListPools(ctx context.Context) ([]Pool, error) {
	var ps []Pool
	_, err := c.do(ctx, http.MethodGet, "/pools", nil, &ps)
	return ps, err
}

// SetPool sets a template's warm-pool size (admin key; 0 removes the pool).
func (c *Client) SetPool(ctx context.Context, template string, size int) (Pool, error) {
	var p Pool
	_, err := c.do(ctx, http.MethodPut, "/pools/"+url.PathEscape(template), map[string]int{"size": size}, &p)
	return p, err
}
