package agent

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/envd/process"
	"github.com/cella-sandbox/cella/internal/envd/process/processconnect"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// defaultKeepalive is envd's keepalive interval when the client sends none.
const defaultKeepalive = 90 * time.Second

// processService implements process.Process.
type processService struct{ s *Server }

var _ processconnect.ProcessHandler = processService{}

// keepaliveInterval reads Keepalive-Ping-Interval (seconds, up to a day: a
// larger number would wrap around as a duration, and a ticker panics on a
// negative one).
func keepaliveInterval(h http.Header) time.Duration {
	if v, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && v > 0 && v <= 86400 {
		return time.Duration(v) * time.Second
	}
	return defaultKeepalive
}

// processTimeout is the process lifetime asked for with Connect-Timeout-Ms.
// The header is read directly so that the reported value is exactly what
// the client asked for; the context deadline is the fallback.
func processTimeout(ctx context.Context, h http.Header) time.Duration {
	if v, err := strconv.ParseInt(h.Get("Connect-Timeout-Ms"), 10, 64); err == nil && v > 0 {
		return time.Duration(v) * time.Millisecond
	}
	if dl, ok := ctx.Deadline(); ok {
		return time.Until(dl)
	}
	return 0
}

func (ps processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) (err error) {
	defer rpcError(&err)
	s := ps.s
	u, err := s.requestUser(req.Header())
	if err != nil {
		return err
	}
	spec, err := s.resolveStart(u, req.Msg, processTimeout(ctx, req.Header()))
	if err != nil {
		return err
	}
	spec.quiet = isQuietStart(ctx) // spawn.go: only the agent's own warm-up
	// The process must outlive this request (background commands, client
	// disconnects), so nothing below is tied to ctx except the stream.
	p, sub, err := s.startProcess(spec)
	if err != nil {
		return err
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	if err := send(startEvent(p.pid)); err != nil {
		p.unsubscribe(sub)
		return err
	}
	// The deadline is the process's lifetime: it ends the stream as envd
	// does (deadline_exceeded, which the SDKs raise as a timeout error)
	// and kills the process, whose timer may not have fired yet.
	reason := timeoutReason(spec.timeout)
	deadline := func() error {
		p.kill(s, reason)
		return errdefs.DeadlineExceeded("%s", reason)
	}
	return streamEvents(ctx, p, sub, keepaliveInterval(req.Header()), send, deadline)
}

func (ps processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) (err error) {
	defer rpcError(&err)
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub := p.subscribe()
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	if err := send(startEvent(p.pid)); err != nil {
		p.unsubscribe(sub)
		return err
	}
	// A re-attached stream's deadline ends only the stream (envd's too).
	deadline := func() error { return errdefs.Wrap(errdefs.KindDeadlineExceeded, ctx.Err()) }
	return streamEvents(ctx, p, sub, keepaliveInterval(req.Header()), send, deadline)
}

func (ps processService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	var out []*process.ProcessInfo
	for _, p := range ps.s.procs.running() {
		// The SDK dereferences config, so it is always set.
		cfg := p.config
		if cfg == nil {
			cfg = &process.ProcessConfig{}
		}
		out = append(out, &process.ProcessInfo{Config: cfg, Pid: uint32(p.pid), Tag: p.tag})
	}
	return connect.NewResponse(&process.ListResponse{Processes: out}), nil
}

func (ps processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (_ *connect.Response[process.UpdateResponse], err error) {
	defer rpcError(&err)
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty != nil {
		if err := p.resize(req.Msg.GetPty().GetSize()); err != nil {
			return nil, errdefs.Wrap(errdefs.KindInvalidArgument, err)
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

func (ps processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (_ *connect.Response[process.SendInputResponse], err error) {
	defer rpcError(&err)
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.writeInput(req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (ps processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (_ *connect.Response[process.StreamInputResponse], err error) {
	defer rpcError(&err)
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().Event.(type) {
		case *process.StreamInputRequest_Start:
			found, err := ps.s.procs.find(ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			p = found
		case *process.StreamInputRequest_Data:
			if p == nil {
				return nil, errdefs.FailedPrecondition("the first message must be start")
			}
			if err := p.writeInput(ev.Data.GetInput()); err != nil {
				return nil, err
			}
		case *process.StreamInputRequest_Keepalive:
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (ps processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (_ *connect.Response[process.SendSignalResponse], err error) {
	defer rpcError(&err)
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig unix.Signal
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = unix.SIGKILL
	case process.Signal_SIGNAL_SIGTERM:
		sig = unix.SIGTERM
	default:
		return nil, errdefs.NotImplemented("invalid signal: %s", req.Msg.GetSignal())
	}
	if !p.running() {
		// Retained for a late Connect only (its pid may already belong to
		// another process, which must not get the signal): to a signal it is
		// gone, as envd answers, and the SDKs' kill() returns false.
		return nil, errdefs.NotFound("process with pid %d not found", p.pid)
	}
	if err := p.signal(sig); err != nil {
		return nil, errdefs.Internal("signal process %d: %w", p.pid, err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (ps processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (_ *connect.Response[process.CloseStdinResponse], err error) {
	defer rpcError(&err)
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	p.inputMu.Lock()
	defer p.inputMu.Unlock()
	if p.ptmx != nil {
		// A terminal has no separate stdin to close; end-of-file is the
		// EOF character, which is what closing the input means to it.
		if _, err := p.ptmx.Write([]byte{4}); err != nil && p.running() {
			return nil, errdefs.Internal("write EOF to pty: %w", err)
		}
		return connect.NewResponse(&process.CloseStdinResponse{}), nil
	}
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

// writeInput writes stdin or pty input; the kind must match the process.
func (p *proc) writeInput(in *process.ProcessInput) error {
	p.inputMu.Lock()
	defer p.inputMu.Unlock()
	switch v := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		if p.ptmx != nil {
			return errdefs.Internal("process has a pty; send pty input instead of stdin")
		}
		if p.stdin == nil {
			return errdefs.FailedPrecondition("stdin is not enabled or was closed")
		}
		if _, err := p.stdin.Write(v.Stdin); err != nil {
			return errdefs.Internal("write stdin: %w", err)
		}
	case *process.ProcessInput_Pty:
		if p.ptmx == nil {
			return errdefs.Internal("process has no pty; send stdin instead of pty input")
		}
		if _, err := p.ptmx.Write(v.Pty); err != nil {
			return errdefs.Internal("write pty: %w", err)
		}
	default:
		return errdefs.InvalidArgument("input is required")
	}
	return nil
}

// streamEvents pumps a subscriber into a Start/Connect stream until the end
// event, sending keepalives when idle. A client disconnect only detaches
// the stream; the process keeps running. When the stream's own deadline
// (Connect-Timeout-Ms) passes, the output taken so far is sent and the
// stream ends with deadline's error instead of the end event, as envd's
// does.
func streamEvents(ctx context.Context, p *proc, sub *subscriber, keepalive time.Duration, send func(*process.ProcessEvent) error, deadline func() error) error {
	defer p.unsubscribe(sub)
	timer := time.NewTimer(keepalive)
	defer timer.Stop()
	for {
		evs, closed := sub.take()
		for _, ev := range evs {
			if ev.GetEnd() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// Ended by the timeout's kill, or just as the deadline
				// passed: either way the deadline came first.
				return deadline()
			}
			if err := send(ev); err != nil {
				return err
			}
		}
		if closed {
			return nil
		}
		if len(evs) > 0 {
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(keepalive)
		}
		// Only the deadline (Connect-Timeout-Ms) ends a stream here. A
		// cancelled request context alone is not proof that the client left:
		// Go's server also cancels it when its background read of the
		// connection errors, which happens spuriously on channel streams
		// while the client is still reading. A client that really left is
		// found by the next send (an event or a keepalive) failing.
		done := ctx.Done()
		if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			done = nil
		}
		select {
		case <-sub.wake:
		case <-timer.C:
			if err := send(keepaliveEvent()); err != nil {
				return err
			}
			timer.Reset(keepalive)
		case <-done:
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				slog.Debug("stream context cancelled; streaming on until a send fails", "pid", p.pid)
				continue
			}
			evs, _ := sub.take()
			for _, ev := range evs {
				if ev.GetEnd() != nil {
					break
				}
				if err := send(ev); err != nil {
					return err
				}
			}
			return deadline()
		}
	}
}
