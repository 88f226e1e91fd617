// Package agentclient is the daemon's one client of the agent inside a
// sandbox (internal/agentapi is the contract). A Client is built per sandbox
// from where its agent's live channel connection is found (Conns: the
// sandbox itself, which signals every change of its connection, or one fixed
// connection) and the sandbox's envd access token. It owns what every call
// to an agent needs: the token header, the Basic-auth user, the URLs, and
// the wait for an agent that is re-dialing. No caller writes a request to an
// agent by hand.
package agentclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/channel"
	"github.com/cella-sandbox/cella/internal/envd/process/processconnect"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// Conns is where a client finds the agent's channel connection.
type Conns interface {
	// WaitConn returns the agent's live connection, waiting (until ctx
	// ends) while there is none, and an error once there cannot be one
	// (the sandbox stopped running).
	WaitConn(ctx context.Context) (*channel.Conn, error)
}

// On is the Conns of one connection: calls go over c or fail once it
// closed. It is what the daemon uses between an agent's hello and the
// moment the connection becomes its sandbox's.
func On(c *channel.Conn) Conns { return fixed{c} }

type fixed struct{ c *channel.Conn }

func (f fixed) WaitConn(context.Context) (*channel.Conn, error) {
	if f.c.IsClosed() {
		return nil, errors.New("the agent's connection closed")
	}
	return f.c, nil
}

// RedialGrace is how long a call waits for the agent's connection: an agent
// that is re-dialing (after a daemon restart, a snapshot) is back within
// it.
const RedialGrace = 3 * time.Second

// baseURL addresses the agent's API over a channel transport: the port
// picks the stream's target inside the sandbox, the host is only a name
// (the edge's, so that both share idle streams).
var baseURL = "http://" + agentapi.LinkHost + ":" + strconv.Itoa(agentapi.Port)

// Client calls one sandbox's agent.
type Client struct {
	sandboxID string
	conns     Conns
	token     string
}

// New makes the client of sandboxID's agent, found through conns and
// authorized with token (the envd access token the agent holds; "" sends
// none).
func New(sandboxID string, conns Conns, token string) *Client {
	return &Client{sandboxID: sandboxID, conns: conns, token: token}
}

// Conn returns the agent's live connection, waiting up to RedialGrace for
// one; the error is Unavailable.
func (c *Client) Conn(ctx context.Context) (*channel.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, RedialGrace)
	defer cancel()
	conn, err := c.conns.WaitConn(ctx)
	if err != nil {
		return nil, errdefs.Unavailable("the agent of sandbox %s is not connected", c.sandboxID)
	}
	return conn, nil
}

// Link is the agent's connection as the way into the sandbox for traffic
// to any of its ports (internal/edge): no credential is added, the proxy
// checked the request's own.
type Link struct{ conn *channel.Conn }

// Link returns the way into the sandbox over the agent's live connection,
// waiting as Conn does.
func (c *Client) Link(ctx context.Context) (Link, error) {
	conn, err := c.Conn(ctx)
	return Link{conn}, err
}

// RoundTrip sends r to the port of its URL inside the sandbox.
func (l Link) RoundTrip(r *http.Request) (*http.Response, error) {
	return l.conn.Transport().RoundTrip(r)
}

// Closed reports whether the connection ended.
func (l Link) Closed() bool { return l.conn.IsClosed() }

// transport sends requests over the agent's current connection (looked up
// per request, so a re-dialed agent is picked up) with the access token and
// the user.
type transport struct {
	c    *Client
	user string
}

func (t transport) RoundTrip(r *http.Request) (*http.Response, error) {
	conn, err := t.c.Conn(r.Context())
	if err != nil {
		if r.Body != nil {
			r.Body.Close() // a RoundTripper closes the body, even on error
		}
		return nil, err
	}
	r = r.Clone(r.Context())
	if t.c.token != "" {
		r.Header.Set(agentapi.AccessTokenHeader, t.c.token)
	}
	if t.user != "" {
		r.Header.Set("Authorization", agentapi.UserAuthorization(t.user))
	}
	return conn.Transport().RoundTrip(r)
}

// HTTP is an HTTP client of the agent's API acting as user ("" = the
// sandbox's default user); request URLs come from URL.
func (c *Client) HTTP(user string) *http.Client {
	return &http.Client{Transport: transport{c: c, user: user}}
}

// URL is the URL of path (an agentapi route) with query q.
func (c *Client) URL(path string, q url.Values) string {
	if len(q) == 0 {
		return baseURL + path
	}
	return baseURL + path + "?" + q.Encode()
}

// Process is envd's process service as user (PTY sessions, commands).
func (c *Client) Process(user string) processconnect.ProcessClient {
	return processconnect.NewProcessClient(c.HTTP(user), baseURL)
}

// Get makes a GET of path?q with header h; the caller reads and closes the
// answer, whatever its status.
func (c *Client) Get(ctx context.Context, path string, q url.Values, h http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL(path, q), nil)
	if err != nil {
		return nil, err
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	return c.HTTP("").Do(req)
}

// Health asks the agent whether it serves (GET /health).
func (c *Client) Health(ctx context.Context) error {
	resp, err := c.Get(ctx, agentapi.HealthPath, nil, nil)
	if err != nil {
		return fmt.Errorf("agent health: %w", err)
	}
	defer resp.Body.Close()
	return answered(resp, "agent health")
}

// Init updates the running agent's config (POST /init): env vars merged,
// access token, default user and workdir, identity. The client's token must
// be the one the agent holds now.
func (c *Client) Init(ctx context.Context, req agentapi.InitRequest) error {
	return c.post(ctx, agentapi.InitPath, req, "agent init")
}

// SetChannelToken gives the agent the credential of its next hello (POST
// /cella/channel-token, served on the channel only).
func (c *Client) SetChannelToken(ctx context.Context, token string) error {
	return c.post(ctx, agentapi.ChannelTokenPath, agentapi.ChannelTokenRequest{Token: token}, "agent channel token")
}

// Spawn has the agent time count starts of an exec's command shape as
// user ("" = the sandbox's default user), bare and through its exec path
// (POST /cella/spawn, served on the channel only).
func (c *Client) Spawn(ctx context.Context, user string, count int) (agentapi.SpawnResult, error) {
	var res agentapi.SpawnResult
	err := c.call(ctx, agentapi.SpawnPath, user, agentapi.SpawnRequest{Count: count}, &res, "agent spawn")
	return res, err
}

// Warm has the agent start an exec's command shape once as user, bare,
// through its exec path and through its process service in both Connect
// codecs, without any of them listed or audited: what a warm pool does
// before it hands a sandbox out.
func (c *Client) Warm(ctx context.Context, user string) error {
	return c.call(ctx, agentapi.SpawnPath, user, agentapi.SpawnRequest{Count: 1, ThroughConnect: true}, &agentapi.SpawnResult{}, "agent warm-up")
}

func (c *Client) post(ctx context.Context, path string, body any, what string) error {
	return c.call(ctx, path, "", body, nil, what)
}

// call posts body as JSON to path as user and decodes a 2xx answer into
// out (nil: the answer is not read).
func (c *Client) call(ctx context.Context, path, user string, body, out any, what string) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL(path, nil), bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.HTTP(user).Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer resp.Body.Close()
	if err := answered(resp, what); err != nil || out == nil {
		return err
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s: read the answer: %w", what, err)
	}
	return nil
}

// answered is nil for a 2xx answer, else an error with its status and the
// start of its body.
func answered(resp *http.Response, what string) error {
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	return refused(resp, what)
}

// refused is the error of an answer that is not the one wanted.
func refused(resp *http.Response, what string) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return fmt.Errorf("%s: the agent answered %s: %s", what, resp.Status, bytes.TrimSpace(b))
}

// Events follows the agent's audit feed from after the event numbered
// after, calling fn for each event (keepalives left out) until ctx ends, the
// stream breaks or fn fails.
func (c *Client) Events(ctx context.Context, after uint64, fn func(agentapi.AuditEvent) error) error {
	resp, err := c.Get(ctx, agentapi.EventsPath, url.Values{"after": {strconv.FormatUint(after, 10)}}, nil)
	if err != nil {
		return fmt.Errorf("agent events: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return refused(resp, "agent events")
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev agentapi.AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("agent events: %w", err)
		}
		if ev.Kind == agentapi.KindKeepalive {
			continue
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("agent events: %w", err)
	}
	return nil
}
