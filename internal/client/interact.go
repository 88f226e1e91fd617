package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/apiwire"

	"github.com/coder/websocket"
)

// WaitRequest is the body of POST /sandboxes/{id}/wait: a port, or a
// regular expression matched against the output lines of process PID. Not
// apiwire.WaitRequest, whose timeout is raw JSON (the wire takes seconds or
// a duration string); this client always sends seconds.
type WaitRequest struct {
	Port    int     `json:"port,omitempty"`
	Log     string  `json:"log,omitempty"`
	PID     int     `json:"pid,omitempty"`
	Timeout float64 `json:"timeout,omitempty"` // seconds; default 30
}

// WaitResult is the answer of a wait.
type WaitResult = apiwire.WaitResult

// Wait blocks until the port listens or the line appears. A timeout is an
// *APIError with Status 408; a process that ended first is 409.
func (c *Client) Wait(ctx context.Context, id string, req WaitRequest) (WaitResult, error) {
	var out WaitResult
	_, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/wait", req, &out)
	return out, err
}

// LogLine is one retained line of a process's output; ProcessLogs is
// GET /sandboxes/{id}/processes/{pid}/logs. Both are the agent's wire types.
type (
	LogLine     = agentapi.LogEntry
	ProcessLogs = agentapi.ProcessLogs
)

// ProcessLogs reads the retained output of a process started in the sandbox.
func (c *Client) ProcessLogs(ctx context.Context, id string, pid int) (ProcessLogs, error) {
	var out ProcessLogs
	_, err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/processes/"+strconv.Itoa(pid)+"/logs", nil, &out)
	return out, err
}

// PTYOptions select or size the shell of DialPTY.
type PTYOptions struct {
	Session    string // re-attach to this session; "" starts a new shell
	Offset     int64  // with Session: replay only output after this offset (0 = all retained)
	Cols, Rows int
	User       string
}

// DialPTY opens the WebSocket of GET /sandboxes/{id}/pty.
func (c *Client) DialPTY(ctx context.Context, id string, o PTYOptions) (*websocket.Conn, error) {
	u := *c.base
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	default:
		u.Scheme = "ws"
	}
	u.Path += "/sandboxes/" + url.PathEscape(id) + "/pty"
	q := url.Values{}
	if o.Session != "" {
		q.Set("session", o.Session)
		if o.Offset > 0 {
			q.Set("offset", strconv.FormatInt(o.Offset, 10))
		}
	}
	if o.Cols > 0 && o.Rows > 0 {
		q.Set("cols", strconv.Itoa(o.Cols))
		q.Set("rows", strconv.Itoa(o.Rows))
	}
	if o.User != "" {
		q.Set("user", o.User)
	}
	u.RawQuery = q.Encode()
	h := http.Header{}
	h.Set("X-API-Key", c.apiKey)
	conn, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: h, Subprotocols: []string{"cella.pty"}})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			return nil, apiErrorFrom(resp.StatusCode, body)
		}
		return nil, err
	}
	conn.SetReadLimit(4 << 20)
	return conn, nil
}

// BaseURL is the daemon's URL.
func (c *Client) BaseURL() *url.URL { u := *c.base; return &u }

// apiErrorFrom is the *APIError of a non-2xx answer: its JSON message,
// else its text.
func apiErrorFrom(status int, body []byte) error {
	var eb apiwire.Error
	if json.Unmarshal(body, &eb) != nil || eb.Message == "" {
		eb.Message = strings.TrimSpace(string(body))
	}
	return &APIError{Status: status, Message: eb.Message}
}

// Exposed is how to reach a port of a sandbox through the daemon's proxy.
type Exposed struct {
	SandboxID string `json:"sandboxID"`
	Port      int    `json:"port"`
	// URL is <scheme>://<port>-<id>.<domain>[:<daemon port>], which needs
	// wildcard DNS for the domain pointing at the daemon.
	URL string `json:"url"`
	// Host is the Host header that routes to the port.
	Host string `json:"host"`
	// DaemonURL with Host (or the E2b-Sandbox-Id/-Port headers) works
	// without any DNS.
	DaemonURL string `json:"daemonURL"`
	// TrafficAccessToken, when set, must be sent as e2b-traffic-access-token.
	TrafficAccessToken string `json:"trafficAccessToken,omitempty"`
}

// Expose describes the preview URL of a port of a running sandbox.
func (c *Client) Expose(ctx context.Context, id string, port int) (Exposed, error) {
	var d Detail
	if _, err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, &d); err != nil {
		return Exposed{}, err
	}
	if d.State != "" && d.State != "running" {
		return Exposed{}, fmt.Errorf("sandbox %s is %s: resume it first", id, d.State)
	}
	host := strconv.Itoa(port) + "-" + d.SandboxID + "." + d.Domain
	u := url.URL{Scheme: c.base.Scheme, Host: host, Path: "/"}
	if p := c.base.Port(); p != "" && !(c.base.Scheme == "http" && p == "80") && !(c.base.Scheme == "https" && p == "443") {
		u.Host = host + ":" + p
	}
	e := Exposed{SandboxID: d.SandboxID, Port: port, URL: u.String(), Host: host, DaemonURL: c.base.String()}
	if d.TrafficAccessToken != nil {
		e.TrafficAccessToken = *d.TrafficAccessToken
	}
	return e, nil
}
