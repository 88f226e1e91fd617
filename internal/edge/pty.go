package edge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"

	"github.com/cella-sandbox/cella/internal/envd/process"
	"github.com/cella-sandbox/cella/internal/envd/process/processconnect"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// Interactive shells over WebSocket (the daemon's GET /sandboxes/{id}/pty
// authenticates the caller, finds the sandbox and hands the request to
// Shells and Shell.Serve).
//
// Shells keeps one PTY session per (sandbox, session id). A session is a
// shell started through the agent's process API with a pty (the same path as
// E2B's sandbox.pty); the daemon holds its output stream, keeps the last
// ptyRingSize bytes in a ring, and fans the output out to every attached
// WebSocket. Clients come and go; the shell lives until it exits or the
// sandbox ends. Protocol:
//
//	client → server  binary: keystrokes (raw bytes for the pty)
//	                 text:   {"type":"resize","cols":C,"rows":R}
//	                         {"type":"input","data":"..."}
//	                         {"type":"kill"}   (ends the shell)
//	server → client  text:   {"type":"session","session":ID,"pid":P,"offset":O,"replay":N}
//	                         first, then N bytes of replay as binary frames
//	                 binary: output
//	                 text:   {"type":"exit","exitCode":C,"status":"..."} then close
//
// A client re-attaches to a session by its ID (Shells.Get) and replays only
// what came after a stream offset: that of a previous session message plus
// the bytes received since.

const (
	// ptyRingSize is how much output a session keeps for replay.
	ptyRingSize = 1 << 20
	// ptyClientQueue bounds the frames queued for one slow client; past it
	// the client is dropped (it can re-attach and replay).
	ptyClientQueue = 512
	// ptyWriteTimeout bounds one WebSocket write.
	ptyWriteTimeout = 30 * time.Second
	// ptyIdleTimeout ends a shell no client has watched for this long.
	ptyIdleTimeout = time.Hour
	// ptySubprotocol is the subprotocol the server selects.
	ptySubprotocol = "cella.pty"
)

// MaxPTYSize bounds a terminal's columns and rows: far beyond any screen,
// far below the uint16 a pty's window size is (a larger value would wrap).
const MaxPTYSize = 4096

type ptyKey struct{ sandbox, session string }

// Shells holds the live shells of the sandboxes; the zero value is ready.
type Shells struct {
	mu       sync.Mutex
	sessions map[ptyKey]*Shell
}

// Get returns shell session id of the sandbox, nil when there is none (it
// ended, or the daemon restarted).
func (t *Shells) Get(sandboxID, id string) *Shell {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sessions[ptyKey{sandboxID, id}]
}

func (t *Shells) put(s *Shell) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sessions == nil {
		t.sessions = map[ptyKey]*Shell{}
	}
	t.sessions[ptyKey{s.sandboxID, s.id}] = s
}

func (t *Shells) remove(s *Shell) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sessions[ptyKey{s.sandboxID, s.id}] == s {
		delete(t.sessions, ptyKey{s.sandboxID, s.id})
	}
}

// ring keeps the last len(buf) bytes of a stream and its total length.
type ring struct {
	buf   []byte
	total int64 // bytes ever written
}

func (r *ring) write(p []byte) {
	n := int64(len(r.buf))
	if int64(len(p)) >= n {
		copy(r.buf, p[int64(len(p))-n:])
		r.total += int64(len(p))
		return
	}
	pos := r.total % n
	c := copy(r.buf[pos:], p)
	copy(r.buf, p[c:])
	r.total += int64(len(p))
}

// since returns the retained bytes after stream offset off.
func (r *ring) since(off int64) []byte {
	n := int64(len(r.buf))
	start := max(off, r.total-n, 0)
	if start >= r.total {
		return nil
	}
	out := make([]byte, 0, r.total-start)
	for i := start; i < r.total; {
		pos := i % n
		end := min(n, pos+(r.total-i))
		out = append(out, r.buf[pos:end]...)
		i += end - pos
	}
	return out
}

type wsMsg struct {
	typ  websocket.MessageType
	data []byte
}

type ptyClient struct {
	out     chan wsMsg // closed by the session (under its lock) when detached
	dropped bool       // the queue overflowed
}

// Shell is one shell session.
type Shell struct {
	id, sandboxID string
	sb            Sandbox
	table         *Shells
	proc          processconnect.ProcessClient
	cancel        context.CancelFunc

	mu      sync.Mutex
	pid     uint32
	ring    ring
	clients map[*ptyClient]struct{}
	exit    []byte      // the exit message once the shell ended
	idle    *time.Timer // runs while no client is attached
}

// idleLocked starts the idle timer when the last client left.
func (ss *Shell) idleLocked() {
	if len(ss.clients) == 0 && ss.exit == nil && ss.idle == nil {
		ss.idle = time.AfterFunc(ptyIdleTimeout, func() {
			_ = ss.kill(context.Background())
			ss.finish(-1, "no client attached for "+ptyIdleTimeout.String())
		})
	}
}

func newSessionID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (ss *Shell) selector() *process.ProcessSelector {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: ss.pid}}
}

// Start starts a shell (bash -i -l with a cols×rows pty, as user; "" = the
// sandbox's default user) in sb and returns its session once the agent
// reported the pid.
func (t *Shells) Start(ctx context.Context, sb Sandbox, user string, cols, rows uint32) (*Shell, error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ss := &Shell{
		id: newSessionID(), sandboxID: sb.ID(), sb: sb, table: t,
		proc: sb.Process(user), cancel: cancel,
		ring: ring{buf: make([]byte, ptyRingSize)}, clients: map[*ptyClient]struct{}{},
	}
	req := connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, Envs: map[string]string{"TERM": "xterm-256color"}},
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: cols, Rows: rows}},
	})
	req.Header().Set("Keepalive-Ping-Interval", "30")
	stream, err := ss.proc.Start(sctx, req)
	if err != nil {
		cancel()
		return nil, err
	}
	// The first event is the start event with the pid.
	startCtx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	got := make(chan bool, 1)
	go func() { got <- stream.Receive() }()
	select {
	case ok := <-got:
		if !ok {
			cancel()
			err := stream.Err()
			if err == nil {
				err = errors.New("the agent ended the stream before the shell started")
			}
			return nil, fmt.Errorf("start shell: %w", err)
		}
	case <-startCtx.Done():
		cancel()
		return nil, errdefs.Unavailable("the shell did not start within 30s")
	}
	st := stream.Msg().GetEvent().GetStart()
	if st == nil {
		cancel()
		return nil, errors.New("start shell: the agent's first event was not a start event")
	}
	ss.pid = st.GetPid()
	ss.mu.Lock()
	ss.idleLocked()
	ss.mu.Unlock()
	t.put(ss)
	go func() {
		ended := pumpPTY(ss, stream)
		for !ended && sctx.Err() == nil {
			ended = ss.reconnect(sctx)
		}
		if !ended {
			ss.finish(-1, "the session was closed")
		}
	}()
	return ss, nil
}

type eventMsg[T any] interface {
	*T
	GetEvent() *process.ProcessEvent
}

// pumpPTY forwards a stream's events; it reports whether the shell ended.
func pumpPTY[T any, PT eventMsg[T]](ss *Shell, stream *connect.ServerStreamForClient[T]) bool {
	defer stream.Close()
	for stream.Receive() {
		ev := PT(stream.Msg()).GetEvent()
		if d := ev.GetData(); d != nil {
			if b := d.GetPty(); len(b) > 0 {
				ss.output(b)
			}
		}
		if e := ev.GetEnd(); e != nil {
			ss.finish(int(e.GetExitCode()), e.GetStatus())
			return true
		}
	}
	return false
}

// reconnect re-attaches to the shell after the output stream broke (e.g. the
// agent re-dialed the daemon). It gives up after a minute, ending the session.
func (ss *Shell) reconnect(ctx context.Context) bool {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if why, ended := ss.sb.Ended(); ended {
			ss.finish(-1, why)
			return true
		}
		req := connect.NewRequest(&process.ConnectRequest{Process: ss.selector()})
		req.Header().Set("Keepalive-Ping-Interval", "30")
		stream, err := ss.proc.Connect(ctx, req)
		if err == nil && stream.Receive() {
			return pumpPTY(ss, stream)
		}
		if err == nil {
			err = stream.Err()
			stream.Close()
		}
		if connect.CodeOf(err) == connect.CodeNotFound {
			ss.finish(-1, "the shell is gone")
			return true
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	ss.finish(-1, "lost the connection to the shell")
	return true
}

func (ss *Shell) output(b []byte) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.ring.write(b)
	msg := wsMsg{websocket.MessageBinary, b}
	for c := range ss.clients {
		select {
		case c.out <- msg:
		default:
			c.dropped = true
			ss.detachLocked(c)
		}
	}
}

func (ss *Shell) finish(code int, status string) {
	ss.mu.Lock()
	if ss.exit != nil {
		ss.mu.Unlock()
		return
	}
	ss.exit, _ = json.Marshal(map[string]any{"type": "exit", "exitCode": code, "status": status})
	for c := range ss.clients {
		select {
		case c.out <- wsMsg{websocket.MessageText, ss.exit}:
		default:
		}
		ss.detachLocked(c)
	}
	if ss.idle != nil {
		ss.idle.Stop()
	}
	ss.mu.Unlock()
	ss.table.remove(ss)
	ss.cancel()
}

func (ss *Shell) detachLocked(c *ptyClient) {
	if _, ok := ss.clients[c]; ok {
		delete(ss.clients, c)
		close(c.out)
		ss.idleLocked()
	}
}

func (ss *Shell) detach(c *ptyClient) {
	ss.mu.Lock()
	ss.detachLocked(c)
	ss.mu.Unlock()
}

// attach queues the session message and the replay after offset, then adds
// the client, atomically with respect to new output.
func (ss *Shell) attach(offset int64) (*ptyClient, bool) {
	c := &ptyClient{out: make(chan wsMsg, ptyClientQueue+4)}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.exit != nil {
		return nil, false
	}
	replay := ss.ring.since(offset)
	hello, _ := json.Marshal(map[string]any{"type": "session", "session": ss.id, "pid": ss.pid, "offset": ss.ring.total - int64(len(replay)), "replay": len(replay)})
	c.out <- wsMsg{websocket.MessageText, hello}
	if len(replay) > 0 {
		c.out <- wsMsg{websocket.MessageBinary, replay}
	}
	ss.clients[c] = struct{}{}
	if ss.idle != nil {
		ss.idle.Stop()
		ss.idle = nil
	}
	return c, true
}

// ptyControl is a text frame from a client.
type ptyControl struct {
	Type string `json:"type"`
	Cols uint32 `json:"cols"`
	Rows uint32 `json:"rows"`
	Data string `json:"data"`
}

func (ss *Shell) input(ctx context.Context, b []byte) error {
	_, err := ss.proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
		Process: ss.selector(), Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: b}},
	}))
	return err
}

func (ss *Shell) resize(ctx context.Context, cols, rows uint32) error {
	_, err := ss.proc.Update(ctx, connect.NewRequest(&process.UpdateRequest{
		Process: ss.selector(), Pty: &process.PTY{Size: &process.PTY_Size{Cols: cols, Rows: rows}},
	}))
	return err
}

func (ss *Shell) kill(ctx context.Context) error {
	_, err := ss.proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: ss.selector(), Signal: process.Signal_SIGNAL_SIGKILL}))
	if connect.CodeOf(err) == connect.CodeNotFound {
		return nil // it ended already (envd's answer to a signal then): what kill wants
	}
	return err
}

// ID is the session's ID (?session= to re-attach).
func (ss *Shell) ID() string { return ss.id }

// Serve takes r's WebSocket as a client of the shell: the session message
// and the output after stream offset offset, then the output as it comes,
// while the client's keystrokes and control messages go to the shell. It
// returns when the client or the shell is gone.
func (ss *Shell) Serve(w http.ResponseWriter, r *http.Request, offset int64) {
	var protos []string
	for _, p := range WebSocketProtocols(r) {
		if p == ptySubprotocol {
			protos = []string{ptySubprotocol}
		}
	}
	// The caller authenticated the request; any origin may connect.
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: protos, InsecureSkipVerify: true})
	if err != nil {
		return
	}
	conn.SetReadLimit(1 << 20)
	c, ok := ss.attach(offset)
	if !ok {
		_ = conn.Close(websocket.StatusNormalClosure, "the shell has ended")
		return
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()

	// Writer: drains the queue; when the session closes it, closes the socket.
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for m := range c.out {
			wctx, stop := context.WithTimeout(ctx, ptyWriteTimeout)
			err := conn.Write(wctx, m.typ, m.data)
			stop()
			if err != nil {
				ss.detach(c)
				for range c.out {
				}
				cancel()
				return
			}
		}
		if c.dropped {
			_ = conn.Close(websocket.StatusPolicyViolation, "client too slow: re-attach with ?session=&offset=")
		} else {
			_ = conn.Close(websocket.StatusNormalClosure, "the shell has ended")
		}
		cancel()
	}()

	// Reader: input and control frames.
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			break
		}
		var rerr error
		switch typ {
		case websocket.MessageBinary:
			if len(data) > 0 {
				rerr = ss.input(ctx, data)
			}
		case websocket.MessageText:
			var m ptyControl
			if err := json.Unmarshal(data, &m); err != nil {
				rerr = fmt.Errorf("bad control message: %v", err)
				break
			}
			switch m.Type {
			case "resize":
				if m.Cols == 0 || m.Rows == 0 || m.Cols > MaxPTYSize || m.Rows > MaxPTYSize {
					rerr = fmt.Errorf("resize needs cols and rows from 1 to %d (got %dx%d)", MaxPTYSize, m.Cols, m.Rows)
				} else {
					rerr = ss.resize(ctx, m.Cols, m.Rows)
				}
			case "input":
				rerr = ss.input(ctx, []byte(m.Data))
			case "kill":
				rerr = ss.kill(ctx)
			case "ping":
			default:
				rerr = fmt.Errorf("unknown control message type %q", m.Type)
			}
		}
		if rerr != nil && ctx.Err() == nil {
			msg, _ := json.Marshal(map[string]string{"type": "error", "message": rerr.Error()})
			wctx, stop := context.WithTimeout(ctx, ptyWriteTimeout)
			_ = conn.Write(wctx, websocket.MessageText, msg)
			stop()
		}
	}
	ss.detach(c)
	cancel()
	<-writerDone
	_ = conn.CloseNow()
}

// WebSocketProtocols are the subprotocols a WebSocket request offers
// (Sec-WebSocket-Protocol).
func WebSocketProtocols(r *http.Request) []string {
	var out []string
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}
