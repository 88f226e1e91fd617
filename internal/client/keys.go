package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Key is an API key's public part; Key is set only when it was just created.
type Key struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Key  string `json:"key,omitempty"`
	// TeamID and Team are the team whose sandboxes the key shares.
	TeamID string `json:"teamID"`
	Team   string `json:"team"`
	// Secrets are the secrets the key may attach ("*": all).
	Secrets     []string  `json:"secrets"`
	MCPMaxCalls int64     `json:"mcpMaxCalls"`
	CreatedAt   time.Time `json:"createdAt"`
	EgressAllow []string  `json:"egressAllow"`
	// Egress describes what the key's sandboxes may reach at most.
	Egress string `json:"egress"`
}

// NewKey is what CreateKey makes a key from.
type NewKey struct {
	Name string `json:"name"`
	// Team is the team to join (made if needed); "" gives the key a team
	// of its own.
	Team        string   `json:"team,omitempty"`
	MCPMaxCalls int64    `json:"mcpMaxCalls,omitempty"`
	EgressAllow []string `json:"egressAllow,omitempty"`
	// Secrets the key may attach to requests or environments ("*": all).
	Secrets []string `json:"secrets,omitempty"`
}

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
