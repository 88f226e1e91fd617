package client

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"
)

// BlockedEvent is one thing a sandbox's egress policy refused.
type BlockedEvent struct {
	Time   time.Time `json:"time"`
	Kind   string    `json:"kind"`  // connect or dns
	Proto  string    `json:"proto"` // http, tls, tcp or dns
	Dst    string    `json:"dst"`
	Host   string    `json:"host"`
	Rule   string    `json:"rule"`
	Reason string    `json:"reason"`
}

// String is the line shown to people and agents.
func (e BlockedEvent) String() string {
	what := e.Host
	if what == "" {
		what = e.Dst
	} else if e.Dst != "" && e.Kind != "dns" {
		what += " (" + e.Dst + ")"
	}
	return fmt.Sprintf("network: blocked %s %s: %s", e.Proto, what, e.Reason)
}

// BlockedSince returns what the sandbox's policy blocked since t, from its
// audit log (GET /sandboxes/{id}/logs).
func (c *Client) BlockedSince(ctx context.Context, id string, t time.Time) ([]BlockedEvent, error) {
	q := url.Values{}
	q.Set("since", strconv.FormatInt(t.UnixMilli(), 10))
	q.Set("decision", "blocked")
	q.Set("kind", "connect,dns")
	var out struct {
		Entries []BlockedEvent `json:"entries"`
	}
	if _, err := c.do(ctx, "GET", "/sandboxes/"+url.PathEscape(id)+"/logs?"+q.Encode(), nil, &out); err != nil {
		return nil, err
	}
	return out.Entries, nil
}
