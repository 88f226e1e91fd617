package agent

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/envd/process"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

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
	// quiet starts a command of the agent's own (SpawnPath): not in the
	// process table, the process logs or the audit feed.
	quiet bool
}

// resolveStart turns a request into a startSpec: user, cwd, env, executable.
func (s *Server) resolveStart(u *sandboxUser, req *process.StartRequest, timeout time.Duration) (*startSpec, error) {
	pc := req.GetProcess()
	if pc == nil || pc.GetCmd() == "" {
		return nil, errdefs.InvalidArgument("process.cmd is required")
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
		return nil, errdefs.Wrap(errdefs.KindInvalidArgument, err)
	}
	if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
		return nil, errdefs.InvalidArgument("cwd '%s' does not exist", cwd)
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

	cmd := pc.GetCmd()
	exe, err := lookPath(cmd, env.get("PATH"), cwd)
	if err != nil && cmd == bashPath && isExecutable(shPath) {
		// E2B's SDKs always ask for bash; an image without it (Alpine,
		// busybox) runs the command with its sh, as `bash -l -c` would.
		cmd, exe, err = shPath, shPath, nil
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.KindInvalidArgument, err)
	}
	stdin := req.Stdin == nil || req.GetStdin()
	return &startSpec{
		user:    u,
		argv0:   exe,
		argv:    append([]string{cmd}, pc.GetArgs()...),
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
		subs:   map[*subscriber]struct{}{},
		quiet:  spec.quiet,
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
	sys := s.sysProcAttr() // limits.go: own session, the commands' cgroup

	if spec.pty != nil {
		ptmx, tty, err := openPTY(spec.pty)
		if err != nil {
			return nil, nil, errdefs.Internal("open pty: %w", err)
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
				return nil, nil, errdefs.Internal("stdin pipe: %w", err)
			}
			inR, p.stdin = r, w
		} else {
			f, err := os.Open(os.DevNull)
			if err != nil {
				return nil, nil, errdefs.Internal("open %s: %w", os.DevNull, err)
			}
			inR = f
		}
		outR, outW, err := os.Pipe()
		if err != nil {
			closeAll([]*os.File{inR, p.stdin})
			return nil, nil, errdefs.Internal("stdout pipe: %w", err)
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			closeAll([]*os.File{inR, p.stdin, outR, outW})
			return nil, nil, errdefs.Internal("stderr pipe: %w", err)
		}
		childFiles = append(childFiles, inR, outW, errW)
		parentReads = append(parentReads, outR, errR)
		p.pipes = parentReads
		files = [3]uintptr{inR.Fd(), outW.Fd(), errW.Fd()}
		readers = append(readers,
			func() { p.readLoop(outR, outStdout) },
			func() { p.readLoop(errR, outStderr) })
	}

	attr := &syscall.ProcAttr{Dir: spec.cwd, Env: spec.env, Files: files[:], Sys: sys}
	var sub *subscriber
	pid, waitCh, err := s.spawn(spec.user, spec.argv0, spec.argv, attr, func(pid int) {
		// Register and subscribe while the reaper waits on its mutex, so
		// neither the exit nor the first byte of output can be missed.
		p.pid = pid
		sub = p.subscribe()
		if !p.quiet {
			s.procs.add(p)
			s.logs.attach(p)
		}
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
		return nil, nil, errdefs.Internal("start %s: %w", spec.argv[0], err)
	}
	adjustOOM(pid)
	if !p.quiet {
		slog.Info("process started", "pid", pid, "cmd", spec.config.GetCmd(), "user", spec.user.Name, "cwd", spec.cwd)
		s.audit.emit(agentapi.AuditEvent{Kind: "process.start", PID: pid, Cmd: auditCmd(append([]string{spec.config.GetCmd()}, spec.config.GetArgs()...)), User: spec.user.Name, Cwd: spec.cwd})
	}

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

// spawn forks argv as user u, under the Landlock ruleset of its commands
// when there is one (landlock.go), and hands the child to the reaper.
// registered, if not nil, runs with the child's pid before the reaper can
// reap it.
func (s *Server) spawn(u *sandboxUser, argv0 string, argv []string, attr *syscall.ProcAttr, registered func(pid int)) (int, <-chan unix.WaitStatus, error) {
	attr.Sys.Credential = credentialOf(u)
	rs, err := s.landlockRuleset(u)
	if err != nil {
		return 0, nil, err
	}
	defer rs.Close()
	return s.reaper.start(func() (int, error) {
		pid, err := rs.forkExec(argv0, argv, attr)
		if err == nil && registered != nil {
			registered(pid)
		}
		return pid, err
	})
}

// credentialOf is what a command of user u is started with: nil when that
// is the agent's own (root).
func credentialOf(u *sandboxUser) *syscall.Credential {
	if u.UID != uint32(os.Geteuid()) || u.GID != uint32(os.Getegid()) || u.UID != 0 {
		return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	return nil
}

// waitProcess turns the exit status into the end event.
func (s *Server) waitProcess(p *proc, waitCh <-chan unix.WaitStatus, readWG *sync.WaitGroup) {
	ws := <-waitCh
	drained := make(chan struct{})
	go func() { readWG.Wait(); close(drained) }()
	p.awaitOutput(drained, cmp.Or(s.opts.DrainGrace, defaultDrainGrace))
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
		reason := enospcReason(limits.DiskBytes, s.opts.DiskPath) // landlock_volumes.go
		end.Error = &reason
	}
	p.end = end
	p.log.finish(end)
	// The audit feed hears of the exit before any client does, so that a
	// client looking up the command's span right after its end finds it.
	if !p.quiet {
		code := end.ExitCode
		s.audit.emit(agentapi.AuditEvent{Kind: "process.exit", PID: p.pid, ExitCode: &code, Status: end.Status, Error: end.GetError()})
	}
	ev := endEvent(end)
	for sub := range p.subs {
		sub.push(ev, true)
	}
	p.subs = nil
	p.mu.Unlock()
	s.watchdog.track(p.pid)
	if !p.quiet {
		slog.Info("process ended", "pid", p.pid, "status", end.Status, "error", end.GetError())
	}

	time.AfterFunc(endRetention, func() { s.procs.forget(p) })
}

// awaitOutput returns once the output of the exited process is forwarded:
// when its readers reach EOF, or, if something else keeps a pipe open (a
// background grandchild), once grace passed and nothing is left in the
// pipes nor held by a reader. Output the process wrote before it
// exited is never cut off by a reader that was slow to run (a loaded
// host: 200 ms was not always enough); only maxDrain bounds the wait, for
// a grandchild that keeps writing.
func (p *proc) awaitOutput(drained <-chan struct{}, grace time.Duration) {
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-drained:
		return
	case <-t.C:
	}
	deadline := time.Now().Add(maxDrain)
	for time.Now().Before(deadline) {
		p.drainMu.Lock()
		empty := p.pipesEmpty()
		p.drainMu.Unlock()
		if empty {
			return
		}
		select {
		case <-drained:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
	slog.Warn("output still unread after the process exited; ending it", "pid", p.pid, "waited", maxDrain+grace)
}

// pipesEmpty reports whether the output pipes hold no unread byte (a
// closed one holds none).
func (p *proc) pipesEmpty() bool {
	for _, f := range p.pipes {
		rc, err := f.SyscallConn()
		if err != nil {
			continue
		}
		n := 0
		// TIOCINQ is FIONREAD, which pipes answer too: the bytes unread.
		if rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }) == nil && n > 0 {
			return false
		}
	}
	return true
}

// readLoop forwards one output stream in chunks of at most maxChunk. A
// pipe's chunk is read and forwarded under drainMu (awaitOutput); the
// poller waits for data without it.
func (p *proc) readLoop(f *os.File, kind int) {
	fw := forwarder{p: p, kind: kind, buf: make([]byte, maxChunk)}
	var err error
	if kind == outPty {
		for err == nil {
			var n int
			n, err = f.Read(fw.buf)
			fw.forward(n)
		}
	} else {
		defer f.Close()
		var rc syscall.RawConn
		if rc, err = f.SyscallConn(); err == nil {
			for err == nil {
				err = p.readChunk(rc, &fw)
			}
		}
	}
	// EIO on a pty master means the last slave fd was closed.
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.EIO) && !errors.Is(err, os.ErrClosed) {
		slog.Debug("read process output", "pid", p.pid, "err", err)
	}
}

// readChunk reads one chunk of a pipe and forwards it, under drainMu.
func (p *proc) readChunk(rc syscall.RawConn, fw *forwarder) error {
	var rerr error
	err := rc.Read(func(fd uintptr) bool {
		p.drainMu.Lock()
		defer p.drainMu.Unlock()
		var n int
		n, rerr = unix.Read(int(fd), fw.buf)
		if rerr == unix.EAGAIN || rerr == unix.EINTR {
			return false // wait for data again
		}
		if rerr == nil && n == 0 {
			rerr = io.EOF
		}
		fw.forward(n)
		return true
	})
	if err != nil {
		return err
	}
	return rerr
}

// forwarder sends a stream's chunks to the process's subscribers.
type forwarder struct {
	p    *proc
	kind int
	buf  []byte
	// tail keeps the end of the previous stderr chunk so that the ENOSPC
	// message is found even when split across reads.
	tail []byte
}

func (fw *forwarder) forward(n int) {
	if n <= 0 {
		return
	}
	p := fw.p
	if fw.kind == outStderr {
		const enospc = "No space left on device"
		p.mu.Lock()
		seen := p.sawENOSPC
		p.mu.Unlock()
		if !seen {
			hay := append(fw.tail, fw.buf[:n]...)
			if bytes.Contains(hay, []byte(enospc)) {
				p.mu.Lock()
				p.sawENOSPC = true
				p.mu.Unlock()
			}
			if len(hay) > len(enospc) {
				hay = hay[len(hay)-len(enospc):]
			}
			fw.tail = bytes.Clone(hay)
		}
	}
	p.output(fw.kind, fw.buf[:n])
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
// The shell E2B's clients ask for, and what images without it have.
const (
	bashPath = "/bin/bash"
	shPath   = "/bin/sh"
)

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
