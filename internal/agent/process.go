package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/envd/process"
)

const (
	// maxChunk is the largest data event, like envd.
	maxChunk = 32 << 10
	// endRetention is how long a finished process keeps its end event for
	// a late Connect.
	endRetention = 30 * time.Second
	// drainGrace bounds how long the end event waits for the output pipes
	// after the process exited. Output already written is in the pipe and
	// is read within microseconds; the pipes only stay open longer when a
	// background grandchild inherited them (`sleep 100 &`), and that must
	// not hold the command's result hostage.
	drainGrace = 200 * time.Millisecond
)

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
	done   chan struct{} // closed once the end event is set

	// inputMu serializes writes to stdin / the pty so that concurrent
	// SendInput calls do not interleave within a chunk.
	inputMu sync.Mutex
	stdin   *os.File // pipe to the process's stdin; nil when disabled or closed

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
	mu     sync.Mutex
	queue  []*process.ProcessEvent
	closed bool // the end event was queued; nothing follows
	wake   chan struct{}
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
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector is required"))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.Selector.(type) {
	case *process.ProcessSelector_Pid:
		if p, ok := t.byPid[int(s.Pid)]; ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", s.Pid))
	case *process.ProcessSelector_Tag:
		var best *proc
		for _, p := range t.byPid {
			if p.tag != nil && *p.tag == s.Tag && (best == nil || best.end != nil) {
				best = p
			}
		}
		if best != nil {
			return best, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %s not found", s.Tag))
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector is required"))
	}
}

// startSpec is a resolved StartRequest.
type startSpec struct {
	user    *sandboxUser
	argv0   string // resolved executable
	argv    []string
	env     []string
	cwd     string
	stdin   bool
	pty     *process.PTY
	timeout time.Duration
	config  *process.ProcessConfig
	tag     *string
}

// resolveStart turns a request into a startSpec: user, cwd, env, executable.
func (s *Server) resolveStart(u *sandboxUser, req *process.StartRequest, timeout time.Duration) (*startSpec, error) {
	pc := req.GetProcess()
	if pc == nil || pc.GetCmd() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	cfg := s.config()

	cwd := pc.GetCwd()
	if cwd == "" {
		cwd = cfg.DefaultWorkdir
	}
	if cwd == "" {
		cwd = u.Home
	}
	cwd, err := expandPath(cwd, u.Home)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd '%s' does not exist", cwd))
	}

	// The environment is built from scratch: the agent's own environment
	// (which may carry the daemon's secrets) never reaches a command.
	env := newEnvList()
	env.set("PATH", defaultPath)
	env.set("HOME", u.Home)
	env.set("USER", u.Name)
	env.set("LOGNAME", u.Name)
	for k, v := range s.globalEnv() {
		env.set(k, v)
	}
	for k, v := range pc.GetEnvs() {
		env.set(k, v)
	}

	exe, err := lookPath(pc.GetCmd(), env.get("PATH"), cwd)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	stdin := req.Stdin == nil || req.GetStdin()
	return &startSpec{
		user:    u,
		argv0:   exe,
		argv:    append([]string{pc.GetCmd()}, pc.GetArgs()...),
		env:     env.list(),
		cwd:     cwd,
		stdin:   stdin,
		pty:     req.Pty,
		timeout: timeout,
		config:  pc,
		tag:     req.Tag,
	}, nil
}

// startProcess forks the command and wires its output. The returned
// subscriber is attached before any output is read, so the caller's stream
// sees everything.
func (s *Server) startProcess(spec *startSpec) (*proc, *subscriber, error) {
	outCap := s.config().Limits.OutputBytes
	if outCap <= 0 {
		outCap = defaultOutputBytes
	}
	p := &proc{
		tag:    spec.tag,
		config: spec.config,
		outCap: outCap,
		done:   make(chan struct{}),
		subs:   map[*subscriber]struct{}{},
	}

	var (
		childFiles  []*os.File // closed in the parent after fork
		parentReads []*os.File // owned by the readers; closed here if fork fails
		readers     []func()
		files       [3]uintptr
	)
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			if f != nil {
				f.Close()
			}
		}
	}
	sys := &syscall.SysProcAttr{Setsid: true}

	if spec.pty != nil {
		ptmx, tty, err := openPTY(spec.pty)
		if err != nil {
			return nil, nil, connect.NewError(connect.CodeInternal, fmt.Errorf("open pty: %w", err))
		}
		p.ptmx = ptmx
		childFiles = append(childFiles, tty)
		files = [3]uintptr{tty.Fd(), tty.Fd(), tty.Fd()}
		sys.Setctty = true
		sys.Ctty = 0
		readers = append(readers, func() { p.readLoop(ptmx, outPty) })
	} else {
		var inR *os.File
		if spec.stdin {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, nil, connect.NewError(connect.CodeInternal, fmt.Errorf("stdin pipe: %w", err))
			}
			inR, p.stdin = r, w
		} else {
			f, err := os.Open(os.DevNull)
			if err != nil {
				return nil, nil, connect.NewError(connect.CodeInternal, fmt.Errorf("open %s: %w", os.DevNull, err))
			}
			inR = f
		}
		outR, outW, err := os.Pipe()
		if err != nil {
			closeAll([]*os.File{inR, p.stdin})
			return nil, nil, connect.NewError(connect.CodeInternal, fmt.Errorf("stdout pipe: %w", err))
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			closeAll([]*os.File{inR, p.stdin, outR, outW})
			return nil, nil, connect.NewError(connect.CodeInternal, fmt.Errorf("stderr pipe: %w", err))
		}
		childFiles = append(childFiles, inR, outW, errW)
		parentReads = append(parentReads, outR, errR)
		files = [3]uintptr{inR.Fd(), outW.Fd(), errW.Fd()}
		readers = append(readers,
			func() { p.readLoop(outR, outStdout) },
			func() { p.readLoop(errR, outStderr) })
	}

	if spec.user.UID != uint32(os.Geteuid()) || spec.user.GID != uint32(os.Getegid()) || spec.user.UID != 0 {
		sys.Credential = &syscall.Credential{Uid: spec.user.UID, Gid: spec.user.GID, Groups: spec.user.Groups}
	}

	argv0, argv := spec.argv0, spec.argv
	if helper, mode := s.execHelper(spec.user); helper != "" {
		// Landlock must be applied in the child between fork and exec,
		// which Go cannot do; the helper applies it and execs the command.
		argv = append([]string{helper, ExecHelperCommand, mode, argv0}, argv...)
		argv0 = helper
	}

	attr := &syscall.ProcAttr{Dir: spec.cwd, Env: spec.env, Files: files[:], Sys: sys}
	var pid int
	var waitCh <-chan unix.WaitStatus
	var sub *subscriber
	pid, waitCh, err := s.reaper.start(func() (int, error) {
		pid, err := syscall.ForkExec(argv0, argv, attr)
		if err != nil {
			return 0, err
		}
		// Register and subscribe while the reaper waits on its mutex, so
		// neither the exit nor the first byte of output can be missed.
		p.pid = pid
		sub = p.subscribe()
		s.procs.add(p)
		return pid, nil
	})
	closeAll(childFiles)
	if err != nil {
		if p.ptmx != nil {
			p.ptmx.Close()
		}
		if p.stdin != nil {
			p.stdin.Close()
		}
		closeAll(parentReads)
		return nil, nil, connect.NewError(connect.CodeInternal, fmt.Errorf("start %s: %w", spec.argv[0], err))
	}
	adjustOOM(pid)
	slog.Info("process started", "pid", pid, "cmd", spec.config.GetCmd(), "user", spec.user.Name, "cwd", spec.cwd)

	var readWG sync.WaitGroup
	for _, r := range readers {
		readWG.Add(1)
		go func() { defer readWG.Done(); r() }()
	}
	if spec.timeout > 0 {
		p.mu.Lock()
		p.timer = time.AfterFunc(spec.timeout, func() { p.kill(s, timeoutReason(spec.timeout)) })
		p.mu.Unlock()
	}
	s.watchdog.kick()
	go s.waitProcess(p, waitCh, &readWG)
	return p, sub, nil
}

// waitProcess turns the exit status into the end event.
func (s *Server) waitProcess(p *proc, waitCh <-chan unix.WaitStatus, readWG *sync.WaitGroup) {
	ws := <-waitCh
	drained := make(chan struct{})
	go func() { readWG.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainGrace):
	}
	if p.ptmx != nil {
		// Closing the master ends a reader still blocked on a tty that a
		// background grandchild keeps open.
		p.inputMu.Lock()
		p.ptmx.Close()
		p.inputMu.Unlock()
	}
	p.inputMu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.inputMu.Unlock()

	end := endFromStatus(ws)
	limits := s.config().Limits
	p.mu.Lock()
	if p.timer != nil {
		p.timer.Stop()
	}
	if p.killReason != "" {
		reason := p.killReason
		end = &process.ProcessEvent_EndEvent{ExitCode: -1, Status: reason, Error: &reason}
	} else if end.ExitCode != 0 && limits.DiskBytes > 0 && (p.sawENOSPC || diskFull(s.opts.DiskPath)) {
		reason := diskReason(limits.DiskBytes)
		end.Error = &reason
	}
	p.end = end
	ev := endEvent(end)
	for sub := range p.subs {
		sub.push(ev, true)
	}
	p.subs = nil
	p.mu.Unlock()
	close(p.done)
	s.watchdog.track(p.pid)
	slog.Info("process ended", "pid", p.pid, "status", end.Status, "error", end.GetError())

	time.AfterFunc(endRetention, func() { s.procs.forget(p) })
}

// readLoop forwards one output stream in chunks of at most maxChunk.
func (p *proc) readLoop(f *os.File, kind int) {
	if kind != outPty {
		defer f.Close()
	}
	buf := make([]byte, maxChunk)
	// tail keeps the end of the previous stderr chunk so that the ENOSPC
	// message is found even when split across reads.
	var tail []byte
	const enospc = "No space left on device"
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if kind == outStderr {
				p.mu.Lock()
				seen := p.sawENOSPC
				p.mu.Unlock()
				if !seen {
					hay := append(tail, buf[:n]...)
					if bytes.Contains(hay, []byte(enospc)) {
						p.mu.Lock()
						p.sawENOSPC = true
						p.mu.Unlock()
					}
					if len(hay) > len(enospc) {
						hay = hay[len(hay)-len(enospc):]
					}
					tail = bytes.Clone(hay)
				}
			}
			p.output(kind, buf[:n])
		}
		if err != nil {
			// EIO on a pty master means the last slave fd was closed.
			if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.EIO) && !errors.Is(err, os.ErrClosed) {
				slog.Debug("read process output", "pid", p.pid, "err", err)
			}
			return
		}
	}
}

// adjustOOM undoes the agent's own OOM protection, which children inherit:
// under memory pressure the kernel must pick a command, never the agent.
func adjustOOM(pid int) {
	_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte("100"), 0)
}

// expandPath resolves ~ and relative paths against home, like envd's
// ExpandAndResolve.
func expandPath(p, home string) (string, error) {
	if strings.HasPrefix(p, "~") {
		if len(p) > 1 && p[1] != '/' {
			return "", fmt.Errorf("cannot expand user-specific home dir in '%s'", p)
		}
		p = filepath.Join(home, p[1:])
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(home, p)
	}
	return filepath.Clean(p), nil
}

// lookPath finds cmd on the command's PATH (not the agent's).
func lookPath(cmd, path, cwd string) (string, error) {
	if strings.Contains(cmd, "/") {
		if !filepath.IsAbs(cmd) {
			cmd = filepath.Join(cwd, cmd)
		}
		if isExecutable(cmd) {
			return cmd, nil
		}
		return "", fmt.Errorf("executable '%s' not found", cmd)
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		c := filepath.Join(dir, cmd)
		if isExecutable(c) {
			return c, nil
		}
	}
	return "", fmt.Errorf("executable '%s' not found in PATH", cmd)
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// envList is an ordered environment where later sets win.
type envList struct {
	keys []string
	vals map[string]string
}

func newEnvList() *envList { return &envList{vals: map[string]string{}} }

func (e *envList) set(k, v string) {
	if _, ok := e.vals[k]; !ok {
		e.keys = append(e.keys, k)
	}
	e.vals[k] = v
}

func (e *envList) get(k string) string { return e.vals[k] }

func (e *envList) list() []string {
	out := make([]string, 0, len(e.keys))
	for _, k := range e.keys {
		out = append(out, k+"="+e.vals[k])
	}
	return out
}

// streamEvents pumps a subscriber into a Start/Connect stream until the end
// event, sending keepalives when idle. A client disconnect only detaches
// the stream; the process keeps running. When the stream's own deadline
// (Connect-Timeout-Ms) fires, the process is being killed by the same
// timeout, so the stream lingers briefly to deliver the named end event.
func streamEvents(ctx context.Context, p *proc, sub *subscriber, keepalive time.Duration, send func(*process.ProcessEvent) error) error {
	defer p.unsubscribe(sub)
	timer := time.NewTimer(keepalive)
	defer timer.Stop()
	var linger <-chan time.Time
	for {
		evs, closed := sub.take()
		for _, ev := range evs {
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
		done := ctx.Done()
		if linger != nil {
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
				return nil
			}
			linger = time.After(3 * time.Second)
		case <-linger:
			return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}
	}
}
