package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"

	"github.com/cella-sandbox/cella/internal/apiwire"
)

// Secret is a secret's metadata in E2B's shape: the daemon never returns
// values.
type Secret = apiwire.Secret

// CreateSecret creates a secret at version 1; a taken name is a 409
// (IsConflict). Admin key only.
func (c *Client) CreateSecret(ctx context.Context, name, value string, metadata map[string]string) (Secret, error) {
	var s Secret
	body := apiwire.NewSecret{Name: name, Value: value, Metadata: metadata}
	_, err := c.do(ctx, http.MethodPost, "/secrets", body, &s)
	return s, err
}

// UpdateSecret stores a new value for the secret ref (an ID or a name) as
// its next version. Non-nil metadata replaces the stored metadata; nil keeps
// it. A missing secret is a 404 (IsNotFound). Admin key only.
func (c *Client) UpdateSecret(ctx context.Context, ref, value string, metadata map[string]string) (Secret, error) {
	var s Secret
	body := apiwire.SecretUpdate{Value: value}
	if metadata != nil {
		md := apiwire.SecretMetadata(metadata)
		body.Metadata = &md // sent even when empty: {} clears
	}
	_, err := c.do(ctx, http.MethodPost, "/secrets/"+url.PathEscape(ref), body, &s)
	return s, err
}

// SetSecret updates the secret name, or creates it when there is none.
// Non-nil metadata replaces the stored metadata; nil keeps an existing
// secret's. Admin key only.
func (c *Client) SetSecret(ctx context.Context, name, value string, metadata map[string]string) (Secret, error) {
	// Update first: it is the common case and, unlike create-then-update,
	// never answers 409. A create that loses a race with another creator is
	// followed by one more update.
	s, err := c.UpdateSecret(ctx, name, value, metadata)
	if !IsNotFound(err) {
		return s, err
	}
	s, err = c.CreateSecret(ctx, name, value, metadata)
	if !IsConflict(err) {
		return s, err
	}
	return c.UpdateSecret(ctx, name, value, metadata)
}

// Secrets lists every secret by name, following the X-Next-Token pages.
// Admin key only.
func (c *Client) Secrets(ctx context.Context) ([]Secret, error) {
	var all []Secret
	token := ""
	for {
		path := "/secrets?limit=100"
		if token != "" {
			path += "&nextToken=" + url.QueryEscape(token)
		}
		var page []Secret
		resp, err := c.do(ctx, http.MethodGet, path, nil, &page)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		next := resp.Header.Get("X-Next-Token")
		if next == "" {
			return all, nil
		}
		if next == token {
			return nil, errors.New("list secrets: the daemon returned the same page token twice")
		}
		token = next
	}
}

// GetSecret returns the metadata of the secret ref, an ID or a name. Admin
// key only.
func (c *Client) GetSecret(ctx context.Context, ref string) (Secret, error) {
	var s Secret
	_, err := c.do(ctx, http.MethodGet, "/secrets/"+url.PathEscape(ref), nil, &s)
	return s, err
}

// DeleteSecret removes the secret ref, an ID or a name. Admin key only.
func (c *Client) DeleteSecret(ctx context.Context, ref string) error {
	_, err := c.do(ctx, http.MethodDelete, "/secrets/"+url.PathEscape(ref), nil, nil)
	return err
}
