package agent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/envd/process"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

const (
	// maxChunk is the largest data event, like envd.
	maxChunk = 32 << 10
	// endRetention is how long a finished process keeps its end event for
	// a late Connect.
	endRetention = 30 * time.Second
	// maxDrain bounds how long the end event waits, once the process
	// exited, for output still in its pipes: a background grandchild that
	// keeps writing into them (`yes &`) must not hold the result hostage.
	maxDrain = 5 * time.Second
)

// defaultDrainGrace is Options.DrainGrace's default.
const defaultDrainGrace = 200 * time.Millisecond

// defaultPath is the PATH of commands (and of the agent as PID 1).
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// proc is one process started through process.Process/Start.
type proc struct {
	pid    int
	tag    *string
	config *process.ProcessConfig
	// ptmx is the pty master of a PTY process, else nil.
	ptmx   *os.File
	outCap int64
	quiet  bool // startSpec.quiet
	// log keeps the last output for the logs endpoint (proclog.go).
	log *procLog

	// drainMu is held by an output reader from the read of a chunk until
	// it is forwarded, so that with it held, what the pipes hold
	// (FIONREAD) is all the output not yet sent (waitProcess).
	drainMu sync.Mutex
	pipes   []*os.File // the stdout and stderr read ends (not a pty's)

	// inputMu serializes writes to stdin / the pty so that concurrent
	// SendInput calls do not interleave within a chunk.
	inputMu sync.Mutex
	stdin   *os.File // pipe to the process's stdin; nil when disabled or closed

	// mu guards the fields below; the end event is set once, under mu,
	// and after it nothing else is sent to subscribers.
	mu         sync.Mutex
	subs       map[*subscriber]struct{}
	end        *process.ProcessEvent_EndEvent
	killReason string
	outBytes   int64
	truncated  bool
	sawENOSPC  bool
	timer      *time.Timer
}

// subscriber is one attached Start/Connect stream. Its queue is unbounded so
// a slow client never blocks the process; the output cap bounds it.
type subscriber struct {
	wake chan struct{} // signalled (non-blocking) after every push

	mu     sync.Mutex
	queue  []*process.ProcessEvent
	closed bool // the end event was queued; nothing follows
}

func newSubscriber() *subscriber { return &subscriber{wake: make(chan struct{}, 1)} }

func (s *subscriber) push(ev *process.ProcessEvent, last bool) {
	s.mu.Lock()
	if !s.closed {
		s.queue = append(s.queue, ev)
		s.closed = last
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *subscriber) take() ([]*process.ProcessEvent, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue
	s.queue = nil
	return q, s.closed
}

// subscribe attaches a stream from now on. If the process already ended the
// subscriber gets just the end event.
func (p *proc) subscribe() *subscriber {
	sub := newSubscriber()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		sub.push(endEvent(p.end), true)
		return sub
	}
	p.subs[sub] = struct{}{}
	return sub
}

func (p *proc) unsubscribe(sub *subscriber) {
	p.mu.Lock()
	delete(p.subs, sub)
	p.mu.Unlock()
}

func (p *proc) broadcastLocked(ev *process.ProcessEvent) {
	for sub := range p.subs {
		sub.push(ev, false)
	}
}

func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.end == nil
}

// output forwards a chunk of output, enforcing the output cap: the part past
// the cap is dropped, one marker line says so, and the process keeps
// running (its output is still read so that it never blocks on a full pipe).
func (p *proc) output(kind int, data []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end == nil {
		p.log.write(kind, data)
	}
	if p.end != nil || p.truncated || len(data) == 0 {
		return
	}
	if rest := p.outCap - p.outBytes; int64(len(data)) > rest {
		data = data[:rest]
		p.truncated = true
	}
	p.outBytes += int64(len(data))
	if len(data) > 0 {
		p.broadcastLocked(dataEvent(kind, bytes.Clone(data)))
	}
	if p.truncated {
		markerKind := outStderr
		if kind == outPty {
			markerKind = outPty
		}
		p.broadcastLocked(dataEvent(markerKind, []byte(truncationMarker(p.outCap))))
	}
}

const (
	outStdout = iota
	outStderr
	outPty
)

func dataEvent(kind int, b []byte) *process.ProcessEvent {
	d := &process.ProcessEvent_DataEvent{}
	switch kind {
	case outStdout:
		d.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: b}
	case outStderr:
		d.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: b}
	default:
		d.Output = &process.ProcessEvent_DataEvent_Pty{Pty: b}
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}}
}

func startEvent(pid int) *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: uint32(pid)}}}
}

func endEvent(e *process.ProcessEvent_EndEvent) *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_End{End: e}}
}

func keepaliveEvent() *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}
}

// setKillReason records why the agent is killing the process; the first
// reason wins and becomes the end event's status and error.
func (p *proc) setKillReason(reason string) {
	p.mu.Lock()
	if p.end == nil && p.killReason == "" {
		p.killReason = reason
	}
	p.mu.Unlock()
}

// kill kills the process's whole session with a named reason.
func (p *proc) kill(s *Server, reason string) {
	if !p.running() {
		return
	}
	s.killSession(p.pid, p, reason, sessionMembers(p.pid))
}

// signal sends sig to the process group, so it reaches the whole tree.
func (p *proc) signal(sig unix.Signal) error {
	err := unix.Kill(-p.pid, sig)
	if errors.Is(err, unix.ESRCH) {
		err = unix.Kill(p.pid, sig)
	}
	if errors.Is(err, unix.ESRCH) {
		return nil // already gone; the end event is on its way
	}
	return err
}

// endFromStatus mimics Go's os.ProcessState (ExitCode, String) and the
// error exec.Cmd.Wait returns, which is what envd reports.
func endFromStatus(ws unix.WaitStatus) *process.ProcessEvent_EndEvent {
	switch {
	case ws.Exited():
		code := ws.ExitStatus()
		e := &process.ProcessEvent_EndEvent{ExitCode: int32(code), Exited: true, Status: "exit status " + strconv.Itoa(code)}
		if code != 0 {
			e.Error = &e.Status
		}
		return e
	case ws.Signaled():
		st := "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			st += " (core dumped)"
		}
		return &process.ProcessEvent_EndEvent{ExitCode: -1, Status: st, Error: &st}
	default:
		st := fmt.Sprintf("unknown wait status %#x", uint32(ws))
		return &process.ProcessEvent_EndEvent{ExitCode: -1, Status: st, Error: &st}
	}
}

// procTable holds the running processes and, for endRetention, the ended ones.
type procTable struct {
	mu    sync.Mutex
	byPid map[int]*proc
}

func (t *procTable) add(p *proc) {
	t.mu.Lock()
	t.byPid[p.pid] = p
	t.mu.Unlock()
}

// forget drops an ended process unless its pid was reused meanwhile.
func (t *procTable) forget(p *proc) {
	t.mu.Lock()
	if t.byPid[p.pid] == p {
		delete(t.byPid, p.pid)
	}
	t.mu.Unlock()
}

func (t *procTable) running() []*proc {
	t.mu.Lock()
	all := make([]*proc, 0, len(t.byPid))
	for _, p := range t.byPid {
		all = append(all, p)
	}
	t.mu.Unlock()
	out := all[:0]
	for _, p := range all {
		if p.running() {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pid < out[j].pid })
	return out
}

func (t *procTable) find(sel *process.ProcessSelector) (*proc, error) {
	if sel == nil {
		return nil, errdefs.InvalidArgument("process selector is required")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.Selector.(type) {
	case *process.ProcessSelector_Pid:
		if p, ok := t.byPid[int(s.Pid)]; ok {
			return p, nil
		}
		return nil, errdefs.NotFound("process with pid %d not found", s.Pid)
	case *process.ProcessSelector_Tag:
		// Prefer a running process over a retained ended one.
		var best *proc
		for _, p := range t.byPid {
			if p.tag != nil && *p.tag == s.Tag && (best == nil || !best.running()) {
				best = p
			}
		}
		if best != nil {
			return best, nil
		}
		return nil, errdefs.NotFound("process with tag %s not found", s.Tag)
	default:
		return nil, errdefs.InvalidArgument("process selector is required")
	}
}
