package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Key is an API key's public part; Key is set only when it was just created.
// Not apiwire.APIKey, whose generated usage.vcpus is a float32.
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
	// The key's quota (0 and "": unlimited) and what it holds now.
	KeyLimits
	Usage KeyUsage `json:"usage"`
}

// KeyLimits are a key's quota: running sandboxes, their vCPUs and memory
// together, and its create and request rates ("60/m", "100/s").
type KeyLimits struct {
	MaxSandboxes int    `json:"maxSandboxes"`
	MaxVCPUs     int    `json:"maxVcpus"`
	MaxMemoryMB  int64  `json:"maxMemoryMB"`
	CreateRate   string `json:"createRate"`
	RequestRate  string `json:"requestRate"`
}

// KeyUsage is what a key holds against its quota.
type KeyUsage struct {
	Sandboxes int     `json:"sandboxes"`
	VCPUs     float64 `json:"vcpus"`
	MemoryMB  int64   `json:"memoryMB"`
}

// KeyUpdate is the quota fields to change on a key (nil: unchanged; 0 and
// "": unlimited).
type KeyUpdate struct {
	MaxSandboxes *int    `json:"maxSandboxes,omitempty"`
	MaxVCPUs     *int    `json:"maxVcpus,omitempty"`
	MaxMemoryMB  *int64  `json:"maxMemoryMB,omitempty"`
	CreateRate   *string `json:"createRate,omitempty"`
	RequestRate  *string `json:"requestRate,omitempty"`
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
	// The key's quota (unset: unlimited).
	KeyUpdate
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

// UpdateKey changes a key's quota (admin key only); ref is the key's ID or
// its name.
func (c *Client) UpdateKey(ctx context.Context, ref string, u KeyUpdate) (Key, error) {
	var k Key
	_, err := c.do(ctx, http.MethodPatch, "/keys/"+url.PathEscape(ref), u, &k)
	return k, err
}
