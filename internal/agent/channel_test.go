package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/agentclient"
	"github.com/cella-sandbox/cella/internal/channel"
	"github.com/cella-sandbox/cella/internal/envd/process"
)

// runTestAgent is the test binary acting as a sandbox's agent: a child
// subreaper (standing in for PID 1) with the global reaper, serving the
// channel. It runs until SIGTERM.
func runTestAgent() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "subreaper:", err)
		return 1
	}
	reaper := NewReaper()
	go reaper.Run(ctx)
	srv := NewServer(agentapi.Config{SandboxID: "sbxchan", DefaultUser: "root", ChannelToken: os.Getenv("CELLA_TEST_AGENT_TOKEN")}, Options{Reaper: reaper})
	defer srv.Close()
	if err := serveChannel(ctx, os.Getenv("CELLA_TEST_AGENT_SOCKET"), srv.hello, srv.Handler(), nil); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "serve channel:", err)
		return 1
	}
	return 0
}

func TestChannelAndReaping(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("agent tests run as root")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, agentapi.SocketName)
	const token = "chan-token"
	var tokenMu sync.Mutex
	tokens := []string{token}
	var refusals []channel.Refusal
	ln, err := channel.Listen(sock, channel.ListenOptions{
		Tokens:   func() []string { tokenMu.Lock(); defer tokenMu.Unlock(); return slices.Clone(tokens) },
		OnRefuse: func(r channel.Refusal) { tokenMu.Lock(); refusals = append(refusals, r); tokenMu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "CELLA_TEST_AGENT_SOCKET="+sock, "CELLA_TEST_AGENT_TOKEN="+token)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})

	ctx := ctxT(t, 30*time.Second)
	conn, hello, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if hello.PID != cmd.Process.Pid || hello.SandboxID != "sbxchan" || hello.Version != agentapi.Version {
		t.Fatalf("hello %+v", hello)
	}
	// The agent's API over the channel, through the daemon's client.
	agent := agentclient.New("sbxchan", agentclient.On(conn), "")
	if err := agent.Health(ctx); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: conn.Transport()}
	portURL := func(port int) string { return "http://sandbox:" + strconv.Itoa(port) }

	// A port inside the sandbox (the agent runs in our netns here).
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "backend says "+r.URL.Path)
	}))
	defer backend.Close()
	port, _ := strconv.Atoi(backend.URL[strings.LastIndex(backend.URL, ":")+1:])
	resp, err := hc.Get(portURL(port) + "/x")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "backend says /x" {
		t.Fatalf("port forward: %q", body)
	}
	// A closed port: the stream is closed, the request fails.
	if resp, err := hc.Get(portURL(1) + "/"); err == nil {
		resp.Body.Close()
		t.Fatal("request to a closed port succeeded")
	}

	// Zombie reaping: grandchildren orphaned to the agent are reaped.
	stream, err := agent.Process("").Start(ctx, connect.NewRequest(bashReq("for i in 1 2 3 4 5; do (sleep 1 >/dev/null 2>&1 &); done; echo spawned")))
	if err != nil {
		t.Fatal(err)
	}
	r := &result{}
	for stream.Receive() {
		r.add(stream.Msg().Event)
	}
	if r.end == nil || r.end.Status != "exit status 0" || r.stdout != "spawned\n" {
		t.Fatalf("result %+v %v", r, stream.Err())
	}
	agentPid := cmd.Process.Pid
	sawOrphans := false
	eventually(t, 5*time.Second, "orphans to be reaped", func() bool {
		kids, zombies := childrenOf(agentPid)
		if kids > 0 {
			sawOrphans = true
		}
		return sawOrphans && kids == 0 && zombies == 0
	})

	// The daemon gives the agent its next credential over the channel and
	// drops the session; the agent redials with the new one, which is the
	// only one the daemon takes now.
	next := strings.Repeat("n", 40)
	if err := agent.SetChannelToken(ctx, next); err != nil {
		t.Fatal(err)
	}
	tokenMu.Lock()
	tokens = []string{next}
	tokenMu.Unlock()
	conn.Close()
	conn2, hello2, err := ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	if hello2.Token != next {
		t.Fatalf("redial hello carries %q, want the rotated credential", hello2.Token)
	}
	tokenMu.Lock()
	if len(refusals) != 0 {
		t.Fatalf("the agent's own hellos were refused: %+v", refusals)
	}
	tokenMu.Unlock()
	if err := agentclient.New("sbxchan", agentclient.On(conn2), "").Health(ctx); err != nil {
		t.Fatalf("health after reconnect: %v", err)
	}
	// The first connection is gone: its client says so instead of waiting.
	if err := agent.Health(ctx); err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Fatalf("health over the closed connection: %v", err)
	}
}

// childrenOf counts the live children and zombie children of pid.
func childrenOf(pid int) (live, zombies int) {
	ents, _ := os.ReadDir("/proc")
	buf := make([]byte, 4096)
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		n, ok := readProcFile(p, "/stat", buf)
		if !ok {
			continue
		}
		b := string(buf[:n])
		i := strings.LastIndexByte(b, ')')
		f := strings.Fields(b[i+2:])
		if len(f) < 2 || f[1] != strconv.Itoa(pid) {
			continue
		}
		if f[0] == "Z" {
			zombies++
		} else {
			live++
		}
	}
	return live, zombies
}

func TestLocalHandlerInitNeedsToken(t *testing.T) {
	e := newTestEnv(t)
	local := httptest.NewServer(e.srv.LocalHandler())
	defer local.Close()
	resp, err := http.Post(local.URL+"/init", "application/json", strings.NewReader(`{"accessToken":"stolen"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || e.srv.config().AccessToken != "" {
		t.Fatalf("local /init: %d, token %q", resp.StatusCode, e.srv.config().AccessToken)
	}
	_ = process.Signal_SIGNAL_SIGKILL
}

// TestLocalHandlerHasNoChannelToken: the channel's credential is set over
// the channel only; a program inside the sandbox cannot replace it.
func TestLocalHandlerHasNoChannelToken(t *testing.T) {
	e := newTestEnv(t)
	local := httptest.NewServer(e.srv.LocalHandler())
	defer local.Close()
	before := e.srv.hello().Token
	resp, err := http.Post(local.URL+agentapi.ChannelTokenPath, "application/json", strings.NewReader(`{"token":"`+strings.Repeat("x", 40)+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || e.srv.hello().Token != before {
		t.Fatalf("local channel-token: %d, token %q (was %q)", resp.StatusCode, e.srv.hello().Token, before)
	}
}
