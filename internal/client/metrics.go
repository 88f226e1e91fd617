package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/apiwire"
)

// Metric is one sample of a sandbox's resource use (E2B's SandboxMetric).
type Metric = apiwire.SandboxMetric

// Metrics returns sandbox id's samples between start and end (zero: open),
// oldest first; with end open the last one is of the present.
func (c *Client) Metrics(ctx context.Context, id string, start, end time.Time) ([]Metric, error) {
	q := url.Values{}
	if !start.IsZero() {
		q.Set("start", strconv.FormatInt(start.Unix(), 10))
	}
	if !end.IsZero() {
		q.Set("end", strconv.FormatInt(end.Unix(), 10))
	}
	path := "/sandboxes/" + url.PathEscape(id) + "/metrics"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var ms []Metric
	_, err := c.do(ctx, http.MethodGet, path, nil, &ms)
	return ms, err
}

// LatestMetrics returns the newest sample of each of the sandboxes ids that
// exists, by ID.
func (c *Client) LatestMetrics(ctx context.Context, ids []string) (map[string]Metric, error) {
	var out apiwire.SandboxesWithMetrics
	_, err := c.do(ctx, http.MethodGet, "/sandboxes/metrics?sandbox_ids="+url.QueryEscape(strings.Join(ids, ",")), nil, &out)
	return out.Sandboxes, err
}
