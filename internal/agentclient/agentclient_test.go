package agentclient

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/channel"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// The calls against the real agent are internal/agent's TestDaemonClient
// (it runs as root); these check, without root, what the client puts on the
// wire and how it waits, over a real channel whose far end records what
// reaches it.

type streams struct {
	sess *channel.AgentSession
}

func (s streams) Accept() (net.Conn, error) {
	c, _, err := s.sess.Accept()
	return c, err
}
func (s streams) Close() error   { return s.sess.Close() }
func (s streams) Addr() net.Addr { return &net.UnixAddr{Name: "agent", Net: "unix"} }

// channelTo serves h as the agent's end of a new channel and returns the
// daemon's end.
func channelTo(t *testing.T, h http.Handler) (*channel.Conn, *channel.AgentSession) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), agentapi.SocketName)
	ln, err := channel.Listen(sock, channel.ListenOptions{Tokens: func() []string { return []string{"tok"} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := channel.DialDaemon(ctx, sock, channel.Hello{Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h}
	go func() { _ = hs.Serve(streams{sess}) }()
	t.Cleanup(func() { hs.Close() })
	conn, _, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, sess
}

func TestWire(t *testing.T) {
	type seen struct{ method, path, query, token, auth, body string }
	got := make(chan seen, 8)
	conn, _ := channelTo(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get(agentapi.AccessTokenHeader), r.Header.Get("Authorization"), string(body)}
		switch r.URL.Path {
		case agentapi.InitPath:
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"code":401,"message":"no"}`))
		case agentapi.EventsPath:
			for _, ev := range []agentapi.AuditEvent{{Seq: 3, Kind: "file.write"}, {Seq: 3, Kind: agentapi.KindKeepalive}, {Seq: 4, Kind: "process.start"}} {
				_ = json.NewEncoder(w).Encode(ev)
			}
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	ctx := context.Background()
	c := New("sb1", On(conn), "envd-tok")

	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != (seen{"GET", agentapi.HealthPath, "", "envd-tok", "", ""}) {
		t.Fatalf("health: %+v", s)
	}
	resp, err := New("sb1", On(conn), "").HTTP("user").Get(c.URL(agentapi.EnvsPath, nil))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s := <-got; s.token != "" || s.auth != agentapi.UserAuthorization("user") {
		t.Fatalf("no token, user: %+v", s)
	}
	if err := c.SetChannelToken(ctx, "next-cred"); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s.method != "POST" || s.path != agentapi.ChannelTokenPath || s.body != `{"token":"next-cred"}` {
		t.Fatalf("channel token: %+v", s)
	}
	tok := "t2"
	if err := c.Init(ctx, agentapi.InitRequest{AccessToken: &tok}); err == nil || !strings.Contains(err.Error(), "401 Unauthorized") || !strings.Contains(err.Error(), `"message":"no"`) {
		t.Fatalf("a refused init: %v", err)
	}
	if s := <-got; s.body != `{"accessToken":"t2"}` {
		t.Fatalf("init body: %+v", s)
	}
	var evs []uint64
	if err := c.Events(ctx, 2, func(ev agentapi.AuditEvent) error { evs = append(evs, ev.Seq); return nil }); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s.query != "after=2" || len(evs) != 2 || evs[0] != 3 || evs[1] != 4 {
		t.Fatalf("events: %+v, %v", s, evs)
	}
}

// TestClosedConn: a client on a connection that ended fails at once with
// Unavailable, it does not wait out the grace for a connection that cannot
// come.
func TestClosedConn(t *testing.T) {
	conn, sess := channelTo(t, http.NotFoundHandler())
	sess.Close()
	<-conn.Closed()
	ctx, cancel := context.WithTimeout(context.Background(), RedialGrace/2)
	defer cancel()
	err := New("sb1", On(conn), "").Health(ctx)
	if !errdefs.Is(err, errdefs.KindUnavailable) || !strings.Contains(err.Error(), "the agent of sandbox sb1 is not connected") || ctx.Err() != nil {
		t.Fatalf("health over a closed connection: %v (ctx %v)", err, ctx.Err())
	}
}
