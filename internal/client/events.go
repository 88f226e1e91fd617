package client

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"
)

// BlockedEvent is one thing a sandbox's egress policy refused: the fields
// of an audit entry (apiwire.AuditEntry) it shows, kept as its own type for
// its String method, which a type of apiwire's cannot have.
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

// processSpan is a command's life as the audit log recorded it (the three
// fields of apiwire.AuditEntry it needs).
type processSpan struct {
	Time time.Time `json:"time"`
	Kind string    `json:"kind"`
	PID  uint32    `json:"pid"`
}

// BlockedDuring returns what the sandbox's policy blocked while process
// pid ran: the window is the process's own start and exit in the audit log
// (the sandbox and the daemon share the host's clock), so a command does
// not collect its neighbours' blocks. The blocks since started (with a
// second of slack for the clocks of client and daemon) are read first: when
// there are none, as for most commands, that one request is all it costs.
// Without the process's entries (an older daemon, the agent's feed lagging)
// those blocks are the answer.
func (c *Client) BlockedDuring(ctx context.Context, id string, pid uint32, started time.Time) ([]BlockedEvent, error) {
	evs, err := c.BlockedSince(ctx, id, started.Add(-time.Second))
	if err != nil || len(evs) == 0 || pid == 0 {
		return evs, err
	}
	q := url.Values{}
	q.Set("since", strconv.FormatInt(started.Add(-time.Minute).UnixMilli(), 10))
	q.Set("kind", "process.start,process.exit")
	// The daemon relays the agent's feed a moment after the command ends:
	// up to a second for its exit to arrive (paid only when something was
	// blocked).
	for try := 0; try < 10; try++ {
		var out struct {
			Entries []processSpan `json:"entries"`
		}
		if _, err := c.do(ctx, "GET", "/sandboxes/"+url.PathEscape(id)+"/logs?"+q.Encode(), nil, &out); err != nil {
			return evs, nil
		}
		var start, exit time.Time
		for _, e := range out.Entries {
			if e.PID != pid {
				continue
			}
			switch e.Kind {
			case "process.start":
				start, exit = e.Time, time.Time{} // the newest run of this pid
			case "process.exit":
				exit = e.Time
			}
		}
		if !start.IsZero() && !exit.IsZero() {
			to := exit.Add(100 * time.Millisecond)
			in := evs[:0]
			for _, e := range evs {
				if !e.Time.Before(start) && !e.Time.After(to) {
					in = append(in, e)
				}
			}
			return in, nil
		}
		time.Sleep(100 * time.Millisecond) // the agent's feed may trail the answer
	}
	return evs, nil
}
