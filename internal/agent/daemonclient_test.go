package agent

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/agentclient"
	"github.com/cella-sandbox/cella/internal/channel"
)

// TestDaemonClient holds the two sides of agentapi to each other: the
// daemon's client (agentclient) against this agent's handler, over a real
// channel, as the daemon calls it: the access token on every call, /init
// (which a wrong token may not use), the audit feed, process logs and
// waits, the channel credential, a command as a named user.
func TestDaemonClient(t *testing.T) {
	const token = "envd-token"
	e := newTestEnv(t, func(c *agentapi.Config, _ *Options) {
		c.AccessToken, c.ChannelToken = token, "first-channel-credential"
	})
	ctx := ctxT(t, 60*time.Second)
	sock := filepath.Join(t.TempDir(), agentapi.SocketName)
	ln, err := channel.Listen(sock, channel.ListenOptions{Tokens: func() []string { return []string{"first-channel-credential"} }})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sctx, stop := context.WithCancel(ctx)
	served := make(chan struct{})
	go func() { defer close(served); _ = serveChannel(sctx, sock, e.srv.hello, e.srv.Handler(), nil) }()
	defer func() { stop(); <-served }()
	conn, _, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	agent := agentclient.New("sbxtest", agentclient.On(conn), token)

	if err := agent.Health(ctx); err != nil {
		t.Fatal(err)
	}
	// The token is what lets a call through: without it the agent refuses.
	envs := func(c *agentclient.Client) (int, map[string]string) {
		resp, err := c.Get(ctx, agentapi.EnvsPath, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		m := map[string]string{}
		if resp.StatusCode == 200 {
			_ = json.NewDecoder(resp.Body).Decode(&m)
		}
		return resp.StatusCode, m
	}
	wrong := agentclient.New("sbxtest", agentclient.On(conn), "guess")
	if st, _ := envs(wrong); st != http.StatusUnauthorized {
		t.Fatalf("envs with a wrong token: %d", st)
	}
	newToken, id := "envd-token-2", "sbxfork"
	if err := wrong.Init(ctx, agentapi.InitRequest{AccessToken: &newToken}); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("init with a wrong token: %v", err)
	}
	if err := agent.Init(ctx, agentapi.InitRequest{AccessToken: &newToken, EnvVars: map[string]string{"FROM_INIT": "1"}, SandboxID: &id}); err != nil {
		t.Fatal(err)
	}
	if st, _ := envs(agent); st != http.StatusUnauthorized {
		t.Fatalf("the old token still works after /init replaced it: %d", st)
	}
	agent = agentclient.New("sbxfork", agentclient.On(conn), newToken)
	if st, m := envs(agent); st != 200 || m["FROM_INIT"] != "1" || m["E2B_SANDBOX_ID"] != "sbxfork" {
		t.Fatalf("envs after init: %d %v", st, m)
	}

	// A command as a named user, its retained log, a wait on it, and the
	// audit feed that saw it start and end.
	stream, err := agent.Process("user").Start(ctx, connect.NewRequest(bashReq("id -u; echo ready-line")))
	if err != nil {
		t.Fatal(err)
	}
	r := &result{}
	for stream.Receive() {
		r.add(stream.Msg().Event)
	}
	if r.end == nil || r.stdout != strconv.Itoa(testUID)+"\nready-line\n" {
		t.Fatalf("command as user: %+v %v", r, stream.Err())
	}
	resp, err := agent.Get(ctx, agentapi.WaitPath, url.Values{"log": {"ready-"}, "pid": {strconv.Itoa(int(r.pid))}, "timeout": {"10s"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wr agentapi.WaitResult
	_ = json.NewDecoder(resp.Body).Decode(&wr)
	resp.Body.Close()
	if resp.StatusCode != 200 || !wr.Ready || wr.Line != "ready-line" {
		t.Fatalf("wait: %d %+v", resp.StatusCode, wr)
	}
	resp, err = agent.Get(ctx, agentapi.ProcessLogsPath(int(r.pid)), url.Values{"format": {"text"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(text) != strconv.Itoa(testUID)+"\nready-line\n" {
		t.Fatalf("process logs: %d %q", resp.StatusCode, text)
	}
	var kinds []string
	fctx, fstop := context.WithCancel(ctx)
	err = agent.Events(fctx, 0, func(ev agentapi.AuditEvent) error {
		if ev.PID == int(r.pid) {
			kinds = append(kinds, ev.Kind)
		}
		if ev.Kind == "process.exit" && ev.PID == int(r.pid) {
			fstop()
		}
		return nil
	})
	fstop()
	if strings.Join(kinds, ",") != "process.start,process.exit" {
		t.Fatalf("audit feed: %v (%v)", kinds, err)
	}

	// The next hello's credential comes over the channel.
	next := strings.Repeat("n", agentapi.MinChannelToken)
	if err := agent.SetChannelToken(ctx, next); err != nil {
		t.Fatal(err)
	}
	if got := e.srv.hello().Token; got != next {
		t.Fatalf("hello token %q after SetChannelToken", got)
	}
	if err := agent.SetChannelToken(ctx, "short"); err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("a short channel token: %v", err)
	}
}
