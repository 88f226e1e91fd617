package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/cella-sandbox/cella/internal/apiwire"
)

// Key is an API key's public part; Key is set only when it was just created.
type Key = apiwire.APIKey

// NewKey is what CreateKey makes a key from.
type NewKey = apiwire.NewAPIKey

// CreateKey makes an API key (admin key only).
func (c *Client) CreateKey(ctx context.Context, nk NewKey) (Key, error) {
	var k Key
	_, err := c.do(ctx, http.MethodPost, "/keys", nk, &k)
	return k, err
}

// Keys lists the API keys (admin key only).
func (c *Client) Keys(ctx context.Context) ([]Key, error) {
	var ks []Key
	_, err := c.do(ctx, http.MethodGet, "/keys", nil, &ks)
	return ks, err
}

// SelfKey describes the key this client uses.
func (c *Client) SelfKey(ctx context.Context) (Key, error) {
	var k Key
	_, err := c.do(ctx, http.MethodGet, "/keys/self", nil, &k)
	return k, err
}

// DeleteKey removes an API key (admin key only).
func (c *Client) DeleteKey(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodDelete, "/keys/"+url.PathEscape(id), nil, nil)
	return err
}
