package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/cella-sandbox/cella/internal/apiwire"
)

// Template is an item of GET /templates: E2B's fields and cella's
// template-store ones (storeName, source, sizeBytes, layers).
type Template = apiwire.Template

// ListTemplates returns the templates the key may use.
func (c *Client) ListTemplates(ctx context.Context) ([]Template, error) {
	var ts []Template
	_, err := c.do(ctx, http.MethodGet, "/templates", nil, &ts)
	return ts, err
}

// DeleteTemplate removes a template by ID or alias (an API template of the
// key's team, or for the admin key one of the machine's).
func (c *Client) DeleteTemplate(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodDelete, "/templates/"+url.PathEscape(id), nil, nil)
	return err
}
