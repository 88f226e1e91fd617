package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/channel"
)

// LocalAddr is where programs inside the sandbox reach the agent (envd's
// port on loopback; the code interpreter calls /envs there).
var LocalAddr = "127.0.0.1:" + strconv.Itoa(agentapi.Port)

// Main runs the agent as PID 1 of a sandbox: it reads the config the daemon
// wrote, reaps orphans, connects to the daemon and serves the API until
// SIGTERM/SIGINT or ctx ends.
func Main(ctx context.Context) error {
	slog.SetDefault(slog.New(slog.NewTextHandler(&cappedWriter{w: os.Stderr, left: maxLogBytes}, &slog.HandlerOptions{Level: slog.LevelInfo})))
	// Before any secret is in memory: a process that is not dumpable can
	// be neither traced nor read (/proc/1/mem, /proc/1/environ,
	// process_vm_readv, pidfd_getfd) by the sandbox's root, which lacks
	// CAP_SYS_PTRACE; commands get their dumpability back at exec.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("make the agent undumpable: %w", err)
	}
	cfg, err := agentapi.ReadConfig(agentapi.GuestRunDir)
	if err != nil {
		return err
	}
	socketPath, err := pinRunDir()
	if err != nil {
		return err
	}

	// PID-1 duties. PATH is set for the agent's own lookups; commands get
	// their own environment. The kernel never delivers SIGTERM/SIGINT to a
	// namespace's init without a handler, and with one they mean "shut down
	// cleanly".
	if os.Getenv("PATH") == "" {
		os.Setenv("PATH", defaultPath)
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE, syscall.SIGTTIN, syscall.SIGTTOU)
	// Outside a pid namespace (or under a runtime that keeps its own init)
	// orphans still come to us.
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	// Under memory pressure the kernel must kill a command, never the
	// agent; children get their score back in adjustOOM.
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0)
	// Under the namespaces runtime the agent shares the host pids cgroup
	// with its commands: the threads a fork bomb could keep it from making
	// are made now, before any command runs (about 1 ms). Under gVisor the
	// commands' own guest cgroup caps a bomb (commandCgroup) and the agent
	// is outside it, with the host ceiling's headroom above the capped bomb
	// for its threads (ForkBomb in the conformance suite, a bomb as the
	// first command); there 16 threads cost 20-35 ms of the agent's start
	// (each one a sentry task and a systrap stub thread).
	if cfg.Runtime != "gvisor" {
		prewarmThreads(prewarmedThreads)
	}

	reaper := NewReaper()
	go reaper.Run(ctx)

	srv := NewServer(cfg, Options{Reaper: reaper, SandboxWide: true})
	defer srv.Close()

	// What the first command does not need waits until the daemon has
	// the agent's session (the create is answered by then).
	var afterHello []func()
	if cfg.HasService(agentapi.ServiceCodeInterpreter) {
		ciCtx, ciCancel := context.WithCancel(ctx)
		if ci, done, err := startCodeInterpreter(ciCtx, srv); err != nil {
			ciCancel()
			slog.Error("code interpreter not started", "err", err)
		} else {
			// Its interpreters are killed before the agent exits.
			defer func() { ciCancel(); <-done }()
			// The default python context's interpreter starts at boot,
			// as E2B's kernels do, but after the hello: starting Python
			// is CPU the agent's own start would wait for.
			afterHello = append(afterHello, func() { ci.Warm(ciCtx) })
		}
	}

	if cfg.HasService(agentapi.ServiceDocker) {
		// Before the daemon can send a command: none sees an engine of an
		// earlier boot, or none at all (docker.go); held until the hello.
		if pid, err := srv.startDocker(); err != nil {
			slog.Error("docker engine not started", "err", err)
		} else {
			slog.Info("docker engine started", "pid", pid, "log", dockerdLog)
		}
	}

	var wg sync.WaitGroup
	// In-sandbox loopback listener. Failing to bind is not fatal: the
	// daemon's channel is what matters.
	if ln, err := net.Listen("tcp", LocalAddr); err != nil {
		slog.Warn("local listener", "addr", LocalAddr, "err", err)
	} else {
		hs := newHTTPServer(srv.LocalHandler())
		wg.Add(1)
		go func() { defer wg.Done(); _ = hs.Serve(ln) }()
		go func() { <-ctx.Done(); _ = hs.Close() }()
	}

	slog.Info("agent starting", "sandbox", cfg.SandboxID, "runtime", cfg.Runtime, "version", agentapi.Version)
	var once sync.Once
	err = serveChannel(ctx, socketPath, srv.hello, srv.Handler(), func() {
		once.Do(func() {
			for _, f := range afterHello {
				f()
			}
		})
		if cfg.HasService(agentapi.ServiceDocker) {
			// The engine held at boot goes on; a session after the first
			// follows a lost one, which a restore from memory always is
			// (docker.go).
			srv.releaseDocker()
			srv.repairDocker()
		}
	})
	wg.Wait()
	slog.Info("agent stopped")
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// prewarmedThreads is how many threads the agent makes ahead.
const prewarmedThreads = 16

// prewarmThreads makes the Go runtime create n OS threads now, while it
// still can. During a fork bomb the pids cgroup may refuse new threads until
// the watchdog has killed the bomb, and a runtime that cannot create a thread
// aborts; idle threads are kept and reused, so the agent rides it out.
// Each of n goroutines wires itself to a thread and waits until all are, so
// the runtime must start a thread for each; unwired again, they stay in its
// pool. (Goroutines sleeping in a syscall did it too, but only once sysmon
// took their Ps away: 20 ms of the agent's start.)
func prewarmThreads(n int) {
	var wired, done sync.WaitGroup
	release := make(chan struct{})
	wired.Add(n)
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			wired.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	wired.Wait()
	close(release)
	done.Wait()
}

func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       640 * time.Second, // envd's
		ErrorLog:          slog.NewLogLogger(slog.Default().Handler(), slog.LevelError),
	}
}

// pinRunDir holds the run directory open, before any command runs, and
// returns the daemon's socket as reached through that descriptor. A root
// that may mount (the docker template's has CAP_SYS_ADMIN) can lay a tmpfs
// of its own over /run/cella with a socket where the agent would redial,
// to take the agent's hello credential and pass for it; the pinned
// directory is the daemon's whatever is mounted over its path later. The
// daemon re-creates the socket in that same directory when it restarts, and
// a restore from a checkpoint reopens the descriptor in the restored run
// directory.
func pinRunDir() (string, error) {
	fd, err := unix.Open(agentapi.GuestRunDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("pin the run directory %s: %w", agentapi.GuestRunDir, err)
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", fd, agentapi.SocketName), nil
}

// serveChannel keeps a session with the daemon up until ctx ends: it dials,
// serves the streams the daemon opens, and redials with a short backoff
// when the session drops (daemon restart, host suspend). hello is asked
// for every dial: the credential changes over the channel (credential.go);
// connected (if not nil) is called after each dial that got a session.
func serveChannel(ctx context.Context, socketPath string, hello func() channel.Hello, h http.Handler, connected func()) error {
	ln := newStreamListener()
	hs := newHTTPServer(h)
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()

	backoff := 50 * time.Millisecond
	for {
		sess, err := channel.DialDaemon(ctx, socketPath, hello())
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			slog.Debug("dial daemon", "err", err)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		slog.Info("connected to daemon", "socket", socketPath)
		if connected != nil {
			go connected()
		}
		stopOnCancel := context.AfterFunc(ctx, func() { sess.Close() })
		stopRedial := closeOnRedialSignal(sess) // redial.go
		serveSession(sess, ln)
		stopOnCancel()
		stopRedial()
		sess.Close()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		slog.Warn("daemon session ended; reconnecting")
	}
}

// serveSession dispatches the streams of one session until it ends.
func serveSession(sess *channel.AgentSession, ln *streamListener) {
	for {
		conn, port, err := sess.Accept()
		if err != nil {
			return
		}
		if port == agentapi.Port {
			if !ln.deliver(conn) {
				conn.Close()
			}
			continue
		}
		go forwardPort(conn, port)
	}
}

// forwardPort pipes a stream to a TCP port on the sandbox's loopback.
func forwardPort(st net.Conn, port int) {
	defer st.Close()
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		slog.Debug("forward: dial", "port", port, "err", err)
		return
	}
	defer c.Close()
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(c, st)
		// Half-close so request/response protocols see EOF and still answer.
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(st, c)
		// yamux Close is a half-close (FIN); reading continues.
		_ = st.Close()
		done <- struct{}{}
	}()
	<-done
	<-done
}

// streamListener is a net.Listener fed with channel streams, so that one
// http.Server (with keep-alive) serves every stream of every session.
type streamListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newStreamListener() *streamListener {
	return &streamListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *streamListener) deliver(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *streamListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *streamListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *streamListener) Addr() net.Addr { return channelAddr{} }

type channelAddr struct{}

func (channelAddr) Network() string { return "cella-channel" }
func (channelAddr) String() string  { return fmt.Sprintf("channel:%d", agentapi.Port) }
