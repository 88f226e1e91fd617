package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The Docker engine of a sandbox whose template names agentapi.ServiceDocker
// (the docker template): the daemon started its container with what an
// engine needs inside gVisor (runtime.Spec.ContainerEngine), and the agent
// starts dockerd at boot, before any command runs. The template's own
// files configure the engine (/etc/docker/daemon.json, template/docker.go);
// the agent does what depends on the boot: stale state, forwarding, NAT.

// Paths of the engine inside the sandbox.
const (
	dockerdPath   = "/usr/sbin/dockerd"
	dockerdLog    = "/var/log/dockerd.log"
	iptablesPath  = "/usr/sbin/iptables-legacy"
	ipForwardPath = "/proc/sys/net/ipv4/ip_forward"
	// sandboxLink is the sandbox's one interface out (its network slot).
	sandboxLink = "eth0"
	// dockerBridge is the engine's default bridge, dockerSocket its API.
	dockerBridge = "docker0"
	dockerSocket = "/run/docker.sock"
	// dockerStopGrace is how long a stopping dockerd may take to stop its
	// containers (its own default is 10 s per container) before SIGKILL.
	dockerStopGrace = 30 * time.Second
)

// dockerStale is what a dockerd of an earlier boot leaves on the root (a
// cold boot after a pause without memory keeps the files, not the
// processes): its socket would make the CLI's wait pass before the new
// engine listens, and its pid files make dockerd and containerd refuse to
// start when a new process has the old pid.
var dockerStale = []string{
	dockerSocket, "/run/docker.pid",
	"/run/docker/containerd/containerd.pid", "/run/docker/containerd/containerd.sock",
}

// dockerEngine is the dockerd the agent started.
type dockerEngine struct {
	mu   sync.Mutex
	pid  int
	done chan struct{} // closed when dockerd ended
	held bool          // stopped until the daemon has the agent's session
}

// dockerRenamed are directories of the engine's state that dockerd renames
// away at every start, and makes anew: in a template built on docker they
// sit in a read-only lower layer of the sandbox's overlay, where renaming a
// directory fails (EXDEV) and dockerd with it ("failed to start daemon:
// rename /var/lib/docker/runtimes ..."). They hold nothing that outlives
// an engine (runtime wrappers, temp files); removing them first leaves
// dockerd nothing to rename. Images and containers stay.
var dockerRenamed = []string{"/var/lib/docker/runtimes", "/var/lib/docker/tmp"}

// startDocker starts dockerd at boot, in a session of its own, logging to
// dockerdLog, and holds it stopped (SIGSTOP) until releaseDocker: the
// process exists before any command can run, so the template's docker
// wrapper waits for its socket from the first command on, while its start
// (a second or two of CPU) does not compete with the agent's own before
// the daemon has the agent's session. It returns dockerd's pid.
func (s *Server) startDocker() (int, error) {
	s.docker.mu.Lock()
	defer s.docker.mu.Unlock()
	pid, err := s.startDockerLocked(false)
	if err != nil {
		return 0, err
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err == nil {
		s.docker.held = true
	}
	return pid, nil
}

// releaseDocker lets the dockerd startDocker holds go on, after making the
// sandbox route its bridges out through eth0 (routeBridge): the NAT is in
// place before the engine makes its first bridge.
func (s *Server) releaseDocker() {
	s.docker.mu.Lock()
	defer s.docker.mu.Unlock()
	if !s.docker.held {
		return
	}
	s.docker.held = false
	s.routeBridgeOrWarn()
	if err := syscall.Kill(s.docker.pid, syscall.SIGCONT); err != nil {
		slog.Warn("docker: continue dockerd", "pid", s.docker.pid, "err", err)
	}
}

func (s *Server) routeBridgeOrWarn() {
	if err := s.routeBridge(); err != nil {
		// Containers still run, with no way out; say why once.
		slog.Warn("docker: inner containers get no network", "err", err)
	}
}

// startDockerLocked forks dockerd after removing what an earlier engine
// left; route says whether to set up the bridge's NAT first (a restart:
// the boot's start leaves it to releaseDocker).
func (s *Server) startDockerLocked(route bool) (int, error) {
	for _, p := range dockerStale {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("docker: remove stale %s: %w", p, err)
		}
	}
	for _, p := range dockerRenamed {
		if err := os.RemoveAll(p); err != nil {
			return 0, fmt.Errorf("docker: remove %s: %w", p, err)
		}
	}
	if route {
		s.routeBridgeOrWarn()
	}
	logf, err := os.OpenFile(dockerdLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o640)
	if err != nil {
		return 0, fmt.Errorf("docker: open %s: %w", dockerdLog, err)
	}
	defer logf.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return 0, fmt.Errorf("docker: %w", err)
	}
	defer null.Close()
	attr := &syscall.ProcAttr{
		Dir:   "/",
		Env:   []string{"PATH=" + defaultPath, "HOME=/root", "LANG=C.UTF-8"},
		Files: []uintptr{null.Fd(), logf.Fd(), logf.Fd()},
		// Its own session: not a command, so no command's timeout or kill
		// reaches it (the sandbox's memory limit still counts it).
		Sys: &syscall.SysProcAttr{Setsid: true},
	}
	pid, wait, err := s.reaper.start(func() (int, error) {
		return syscall.ForkExec(dockerdPath, []string{"dockerd"}, attr)
	})
	if err != nil {
		return 0, fmt.Errorf("docker: start %s: %w", dockerdPath, err)
	}
	done := make(chan struct{})
	go func() {
		ws := <-wait
		close(done)
		slog.Warn("docker: dockerd ended", "pid", pid, "status", waitStatusString(ws), "log", dockerdLog)
	}()
	s.docker.pid, s.docker.done = pid, done
	return pid, nil
}

// repairDocker restarts a running engine whose bridge is gone. A sandbox
// restored from memory (a resume, a snapshot, a fork) has its processes
// back but gVisor rebuilds its network from the host's side, eth0 and
// loopback only: the engine's docker0, its containers' links and the NAT
// rule are lost, and the engine would fail every container it starts on
// the bridge. Restarting it makes them anew; running containers stop with
// it (their links are gone too), and those with a restart policy come back.
// The agent calls it on every session with the daemon (serveChannel's
// connected hook): a restore always makes the agent dial again; anywhere
// else it finds the bridge (or no engine up yet) and does nothing.
func (s *Server) repairDocker() {
	if !s.docker.mu.TryLock() {
		return // starting or repairing already
	}
	defer s.docker.mu.Unlock()
	if s.docker.done == nil {
		return
	}
	select {
	case <-s.docker.done:
		return // ended: not the agent's to bring back
	default:
	}
	if _, err := os.Stat(dockerSocket); err != nil {
		return // still starting: the bridge comes before the socket
	}
	if _, err := net.InterfaceByName(dockerBridge); err == nil {
		return
	}
	slog.Warn("docker: the engine's bridge is gone (restored from memory): restarting dockerd", "pid", s.docker.pid)
	_ = syscall.Kill(s.docker.pid, syscall.SIGTERM)
	select {
	case <-s.docker.done:
	case <-time.After(dockerStopGrace):
		_ = syscall.Kill(s.docker.pid, syscall.SIGKILL)
		<-s.docker.done
	}
	if pid, err := s.startDockerLocked(true); err != nil {
		slog.Error("docker engine not restarted", "err", err)
	} else {
		slog.Info("docker engine restarted", "pid", pid)
	}
}

// routeBridge turns on forwarding in the sandbox's netstack and SNATs what
// the engine's bridges send out of eth0 to eth0's own address: gVisor's
// recipe for nested Docker, since the engine's own iptables rules are off.
// What leaves is then the sandbox's traffic like any other, through the
// egress proxy and its policy. A sandbox without a network slot has no
// eth0 and nothing to route.
func (s *Server) routeBridge() error {
	ifc, err := net.InterfaceByName(sandboxLink)
	if err != nil {
		return nil
	}
	addr, err := ipv4Of(ifc)
	if err != nil {
		return err
	}
	if err := os.WriteFile(ipForwardPath, []byte("1"), 0); err != nil {
		return fmt.Errorf("enable forwarding: %w", err)
	}
	for _, proto := range []string{"tcp", "udp"} {
		rule := []string{"POSTROUTING", "-o", sandboxLink, "-p", proto, "-j", "SNAT", "--to-source", addr}
		if _, err := s.runReaped(append([]string{iptablesPath, "-t", "nat", "-C"}, rule...)); err == nil {
			continue // a restart of the engine in the same boot
		}
		if out, err := s.runReaped(append([]string{iptablesPath, "-t", "nat", "-A"}, rule...)); err != nil {
			return fmt.Errorf("iptables SNAT %s: %w: %s", proto, err, out)
		}
	}
	return nil
}

func ipv4Of(ifc *net.Interface) (string, error) {
	addrs, err := ifc.Addrs()
	if err != nil {
		return "", fmt.Errorf("addresses of %s: %w", ifc.Name, err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			return n.IP.String(), nil
		}
	}
	return "", fmt.Errorf("%s has no IPv4 address", ifc.Name)
}

// runReaped runs argv to its end and returns its output. Through the
// reaper: as PID 1 the agent reaps every child, so os/exec's own wait
// would find its child gone.
func (s *Server) runReaped(argv []string) ([]byte, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		w.Close()
		return nil, err
	}
	defer null.Close()
	attr := &syscall.ProcAttr{Env: []string{"PATH=" + defaultPath}, Files: []uintptr{null.Fd(), w.Fd(), w.Fd()}}
	_, wait, err := s.reaper.start(func() (int, error) { return syscall.ForkExec(argv[0], argv, attr) })
	w.Close()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	out, _ := io.ReadAll(io.LimitReader(r, 64<<10))
	if ws := <-wait; !ws.Exited() || ws.ExitStatus() != 0 {
		return out, fmt.Errorf("%s: %s", argv[0], waitStatusString(ws))
	}
	return out, nil
}

func waitStatusString(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return fmt.Sprintf("exit status %d", ws.ExitStatus())
}
