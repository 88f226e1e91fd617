package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"syscall"

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
)

// dockerStale is what a dockerd of an earlier boot leaves on the root (a
// cold boot after a pause without memory keeps the files, not the
// processes): its socket would make the CLI's wait pass before the new
// engine listens, and its pid files make dockerd and containerd refuse to
// start when a new process has the old pid.
var dockerStale = []string{
	"/run/docker.sock", "/run/docker.pid",
	"/run/docker/containerd/containerd.pid", "/run/docker/containerd/containerd.sock",
}

// startDocker makes the sandbox route its engine's bridge out through eth0
// and starts dockerd in a session of its own, logging to dockerdLog. It
// returns dockerd's pid once it runs; the engine then takes a second or two
// to listen, which the template's docker wrapper waits for.
func (s *Server) startDocker() (int, error) {
	for _, p := range dockerStale {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("docker: remove stale %s: %w", p, err)
		}
	}
	if err := routeBridge(); err != nil {
		// Containers still run, with no way out; say why once.
		slog.Warn("docker: inner containers get no network", "err", err)
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
		// Its own session: not a command, so no command's limits, timeout
		// or kill reach it (its containers are the user's commands'
		// business, bounded by the sandbox's own limits).
		Sys: &syscall.SysProcAttr{Setsid: true},
	}
	pid, wait, err := s.reaper.start(func() (int, error) {
		return syscall.ForkExec(dockerdPath, []string{"dockerd"}, attr)
	})
	if err != nil {
		return 0, fmt.Errorf("docker: start %s: %w", dockerdPath, err)
	}
	go func() {
		ws := <-wait
		slog.Warn("docker: dockerd ended", "pid", pid, "status", ws.ExitStatus(), "signal", ws.Signal(), "log", dockerdLog)
	}()
	return pid, nil
}

// routeBridge turns on forwarding in the sandbox's netstack and SNATs what
// the engine's bridges send out of eth0 to eth0's own address: gVisor's
// recipe for nested Docker, since the engine's own iptables rules are off.
// What leaves is then the sandbox's traffic like any other, through the
// egress proxy and its policy. A sandbox without a network slot has no
// eth0 and nothing to route.
func routeBridge() error {
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
		out, err := exec.Command(iptablesPath, "-t", "nat", "-A", "POSTROUTING", "-o", sandboxLink,
			"-p", proto, "-j", "SNAT", "--to-source", addr).CombinedOutput()
		if err != nil {
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
