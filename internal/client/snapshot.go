package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/cella-sandbox/cella/internal/apiwire"
)

// SnapshotInfo is E2B's SnapshotInfo plus cella's fields.
type SnapshotInfo = apiwire.SnapshotInfo

// Snapshot snapshots a running sandbox (it keeps running); name may be "".
func (c *Client) Snapshot(ctx context.Context, id, name string) (SnapshotInfo, error) {
	var out SnapshotInfo
	body := map[string]string{}
	if name != "" {
		body["name"] = name
	}
	_, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/snapshots", body, &out)
	return out, err
}

// ListSnapshots lists snapshots, of one sandbox if sandboxID is set.
func (c *Client) ListSnapshots(ctx context.Context, sandboxID string) ([]SnapshotInfo, error) {
	var all []SnapshotInfo
	next := ""
	for {
		q := url.Values{}
		if sandboxID != "" {
			q.Set("sandboxID", sandboxID)
		}
		if next != "" {
			q.Set("nextToken", next)
		}
		var page []SnapshotInfo
		resp, err := c.do(ctx, http.MethodGet, "/snapshots?"+q.Encode(), nil, &page)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		next = resp.Header.Get("X-Next-Token")
		if next == "" || len(page) == 0 {
			return all, nil
		}
	}
}

// DeleteSnapshot deletes a snapshot (E2B: DELETE /templates/{id}).
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodDelete, "/templates/"+url.PathEscape(id), nil, nil)
	return err
}

// ForkResult is one element of the fork answer.
type ForkResult = apiwire.SandboxForkResult

// Fork starts count sandboxes from a running sandbox's current state.
// timeout 0 means the daemon's default.
func (c *Client) Fork(ctx context.Context, id string, count int, timeout time.Duration) ([]ForkResult, error) {
	body := apiwire.SandboxForkRequest{Count: &count}
	if timeout > 0 {
		body.Timeout = new(int64(timeout / time.Second))
	}
	var out []ForkResult
	_, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/fork", body, &out)
	return out, err
}
