package api_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/image/registrytest"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/template"
)

// TestDockerTemplate runs Docker inside a gVisor sandbox of the docker
// template: an image loaded from a tarball the test makes, one pulled from
// a local registry the sandbox's egress policy allows, a Dockerfile built
// on it and run, a two-service compose project; then what the sandbox's
// Docker and its root cannot do: see the host's files, processes, images
// or socket, reach the host's devices or kernel settings, leave the egress
// policy, or outlive the kill.
func TestDockerTemplate(t *testing.T) {
	ctx := context.Background()
	store, err := template.NewStore(daemontest.CacheDir())
	if err != nil {
		t.Fatal(err)
	}
	// scripts/test.sh builds it before the suite (minutes, once per machine).
	tpl, err := store.EnsureNamed(ctx, template.DockerName, io.Discard)
	if err != nil {
		t.Fatalf("docker template: %v", err)
	}

	t.Run("NamespacesRefuses", func(t *testing.T) {
		env := daemontest.Start(t, runtime.Namespaces, daemontest.Options{})
		_, err := createSandbox(env, map[string]any{"templateID": template.DockerName})
		if err == nil || !strings.Contains(err.Error(), ": 400 ") || !strings.Contains(err.Error(), "needs the gvisor runtime") {
			t.Fatalf("docker template under namespaces: want a 400 naming the gvisor runtime, got %v", err)
		}
	})

	reg := registrytest.Start(t)
	img := busyboxImage(t, filepath.Join(tpl.RootFS, "bin/busybox"))
	reg.Push(t, "tools/bb:2", img)
	regName := "registry.test:" + portOf(t, reg.Addr)
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{Network: daemon.NetworkConfig{
		Allow:   []string{"registry.test"},
		Resolve: []string{"registry.test=" + reg.Addr},
	}})
	a := apiT{env: env}

	// What the host has that the sandbox must not see.
	marker := filepath.Join(t.TempDir(), "host-marker")
	if err := os.WriteFile(marker, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostProc := exec.Command("sleep", "4242.4242")
	if err := hostProc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hostProc.Process.Kill(); hostProc.Wait() })
	// Host kernel settings a sandbox's root would love to write.
	hostSysctls := map[string][]byte{}
	for _, p := range []string{"/proc/sys/kernel/core_pattern", "/proc/sys/kernel/randomize_va_space"} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		hostSysctls[p] = b
	}

	// The template's own defaults (2 GiB, 4 GiB disk): the engine needs more
	// than the daemon's 512 MiB.
	id, sb := mustCreate(t, env, map[string]any{"templateID": template.DockerName})

	// The engine the agent started at boot answers (the docker wrapper
	// waits for it), as the sandbox user, and it is gVisor's, not a host's.
	if d, err := env.Client.Get(ctx, id); err != nil || d.MemoryMB != template.DockerMemoryMB || d.DiskSizeMB != template.DockerDiskMB {
		t.Fatalf("docker sandbox limits: %d MiB memory, %d MiB disk (%v); want the template's %d and %d", d.MemoryMB, d.DiskSizeMB, err, template.DockerMemoryMB, template.DockerDiskMB)
	}
	out := dockerOK(t, sb, "", `docker info --format '{{.Name}} {{.KernelVersion}} {{.Driver}} {{.CgroupVersion}}'`)
	if !strings.Contains(out, "gvisor") {
		t.Fatalf("docker info: want the sandbox's own engine on gVisor's kernel, got %q", out)
	}

	// docker load of a tarball made here (docker save's format).
	var tb bytes.Buffer
	if err := tarball.Write(name.MustParseReference("bb:1"), img, &tb); err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "/home/user/bb.tar", "user", &tb); err != nil {
		t.Fatal(err)
	}
	if out := dockerOK(t, sb, "", "docker load -i /home/user/bb.tar"); !strings.Contains(out, "Loaded image: bb:1") {
		t.Fatalf("docker load: %q", out)
	}

	t.Run("BuildAndRun", func(t *testing.T) {
		df := "FROM bb:1\nRUN echo built-in-the-sandbox > /msg && echo \"$(hostname)\" > /built-on\nCMD [\"cat\", \"/msg\"]\n"
		if err := sb.WriteFile(ctx, "/home/user/app/Dockerfile", "user", strings.NewReader(df)); err != nil {
			t.Fatal(err)
		}
		dockerOK(t, sb, "", "cd ~/app && docker build -t app:1 .")
		if out := dockerOK(t, sb, "", "docker run --rm app:1"); out != "built-in-the-sandbox\n" {
			t.Fatalf("docker run app:1: %q", out)
		}
	})

	t.Run("Compose", func(t *testing.T) {
		yml := `version: "3"
services:
  web:
    image: bb:1
    command: ["httpd", "-f", "-p", "8080", "-h", "/www"]
    volumes: ["./www:/www:ro"]
  client:
    image: bb:1
    depends_on: [web]
    command: ["sh", "-c", "for i in $$(seq 60); do wget -q -O- http://web:8080/index.html && exit 0; sleep 1; done; exit 1"]
`
		if err := sb.WriteFile(ctx, "/home/user/proj/docker-compose.yml", "user", strings.NewReader(yml)); err != nil {
			t.Fatal(err)
		}
		if err := sb.WriteFile(ctx, "/home/user/proj/www/index.html", "user", strings.NewReader("served by compose\n")); err != nil {
			t.Fatal(err)
		}
		out := dockerOK(t, sb, "", "cd ~/proj && docker compose up --no-color --abort-on-container-exit --exit-code-from client 2>&1; rc=$?; docker compose down >/dev/null 2>&1; exit $rc")
		if !strings.Contains(out, "served by compose") {
			t.Fatalf("compose: the client did not get the web page:\n%s", out)
		}
	})

	t.Run("PullFromAllowedRegistry", func(t *testing.T) {
		// The registry speaks plain HTTP: the sandbox's engine is told so,
		// as an operator would (SIGHUP reloads insecure-registries).
		conf := fmt.Sprintf(`{"storage-driver": "vfs", "iptables": false, "ip6tables": false, "insecure-registries": [%q]}`, regName)
		if err := sb.WriteFile(ctx, "/etc/docker/daemon.json", "root", strings.NewReader(conf)); err != nil {
			t.Fatal(err)
		}
		dockerOK(t, sb, "root", fmt.Sprintf(`pkill -HUP -x dockerd; for i in $(seq 600); do docker info --format '{{.RegistryConfig.IndexConfigs}}' | grep -q %q && exit 0; sleep 0.1; done; exit 1`, regName))
		dockerOK(t, sb, "", "docker pull "+regName+"/tools/bb:2")
		if out := dockerOK(t, sb, "", "docker run --rm "+regName+"/tools/bb:2 echo pulled"); out != "pulled\n" {
			t.Fatalf("run of the pulled image: %q", out)
		}
	})

	t.Run("Isolation", func(t *testing.T) {
		// Only what the sandbox made: the images it loaded, built and
		// pulled, and no container left (the host has none to show).
		images := strings.Fields(dockerOK(t, sb, "", "docker images --format '{{.Repository}}'"))
		for _, im := range images {
			if im != "bb" && im != "app" && im != regName+"/tools/bb" {
				t.Errorf("docker images lists %q, which the sandbox never made: %v", im, images)
			}
		}
		if out := dockerOK(t, sb, "", "docker ps -aq"); out != "" {
			t.Errorf("docker ps -a lists containers the sandbox does not have: %q", out)
		}
		// The control: what the sandbox has, its containers see.
		if err := sb.WriteFile(ctx, "/home/user/sandbox-marker", "user", strings.NewReader("sandbox side")); err != nil {
			t.Fatal(err)
		}
		res := shT(t, sb, "root", `ls /var/cache/cella 2>&1; cat `+marker+` 2>&1; docker run --rm -v /:/sandbox bb:1 sh -c 'cat /sandbox/home/user/sandbox-marker; echo; ls /sandbox/var/cache/cella; cat /sandbox`+marker+`' 2>&1; docker run --rm --pid=host bb:1 ps -o args`, 2*time.Minute)
		t.Logf("what the sandbox and its containers see:\n%s", res.Stdout)
		if !strings.Contains(res.Stdout, "sandbox side") {
			t.Errorf("a container with the sandbox's / bound does not see the sandbox's own file:\n%s", res.Stdout)
		}
		for _, leak := range []string{"host secret", "4242.4242", "layers", "images"} {
			if strings.Contains(res.Stdout, leak) {
				t.Errorf("the sandbox or its containers see the host's %q:\n%s", leak, res.Stdout)
			}
		}
		if !strings.Contains(res.Stdout, "dockerd") {
			t.Errorf("--pid=host should show the sandbox's own processes (dockerd):\n%s", res.Stdout)
		}
	})

	t.Run("Escapes", func(t *testing.T) {
		var st syscall.Stat_t
		if err := syscall.Stat("/", &st); err != nil {
			t.Fatal(err)
		}
		maj, min := st.Dev>>8&0xfff, st.Dev&0xff|st.Dev>>12&0xfff00
		// What every sandbox of the daemon runs as PID 1 (agentpin's tmpfs).
		agentBins := func() map[string][]byte {
			out := map[string][]byte{}
			ents, err := os.ReadDir(filepath.Join(env.DataDir, "agent"))
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				if b, err := os.ReadFile(filepath.Join(env.DataDir, "agent", e.Name())); err == nil {
					out[e.Name()] = b
				}
			}
			return out
		}
		agentWas := agentBins()
		if len(agentWas) == 0 {
			t.Fatal("no agent binary found in the daemon's agent dir")
		}
		defer func() {
			now := agentBins()
			for name, b := range agentWas {
				if !bytes.Equal(now[name], b) {
					t.Errorf("the host's agent binary %s changed", name)
				}
			}
		}()
		// As the sandbox's root, and from a privileged inner container.
		script := fmt.Sprintf(`mknod /tmp/hostdisk b %d %d 2>&1; head -c 512 /tmp/hostdisk >/dev/null 2>&1 && echo READ-HOST-DISK
mount -o remount,rw /proc/sys 2>/dev/null
mkdir -p /tmp/m; mount -t ext4 /tmp/hostdisk /tmp/m 2>/dev/null && echo MOUNTED-HOST-DISK
echo '|/tmp/pwn' > /proc/sys/kernel/core_pattern && echo wrote core_pattern in the sandbox
echo 0 > /proc/sys/kernel/randomize_va_space && echo wrote randomize_va_space in the sandbox
if [ -e /.cella/cella ]; then
	mount -o remount,rw /.cella/cella && echo remounted the agent binary read-write
	echo x > /.cella/cella && echo WROTE-AGENT-BINARY
	mount -o remount,rw /run/cella && echo remounted the run dir read-write
	touch /run/cella/x && echo WROTE-RUN-DIR
fi
ls /dev | tr '\n' ' '; echo; echo escape script ran`, maj, min)
		if err := sb.WriteFile(ctx, "/tmp/escape.sh", "root", strings.NewReader(script)); err != nil {
			t.Fatal(err)
		}
		// --privileged asks for capabilities the sandbox does not have
		// (SYS_PTRACE, SYS_MODULE, ...): runc refuses it. The most an inner
		// container can get is the sandbox's own: Docker's default set plus
		// the engine's (SYS_ADMIN, NET_ADMIN, SYS_RESOURCE), no seccomp,
		// any device in its cgroup.
		for _, how := range []string{"sh /tmp/escape.sh",
			"docker run --rm --cap-add SYS_ADMIN --cap-add NET_ADMIN --cap-add SYS_RESOURCE --security-opt seccomp=unconfined --device-cgroup-rule 'b *:* rwm' -v /tmp:/t bb:1 sh /t/escape.sh"} {
			res := shT(t, sb, "root", how, 2*time.Minute)
			t.Logf("%s:\n%s%s", how, res.Stdout, res.Stderr)
			if !strings.Contains(res.Stdout, "escape script ran") {
				t.Fatalf("%s: the attempt did not run: exit %d\n%s%s", how, res.ExitCode, res.Stdout, res.Stderr)
			}
			// The agent binary (shared by every sandbox of the daemon) and the
			// run dir are host files bound read-only: a remount inside the
			// sentry flips its own flag, and the gofer still refuses writes.
			for _, bad := range []string{"HOST-DISK", "WROTE-AGENT-BINARY", "WROTE-RUN-DIR"} {
				if strings.Contains(res.Stdout, bad) {
					t.Errorf("%s: %s:\n%s", how, bad, res.Stdout)
				}
			}
			for p, was := range hostSysctls {
				if now, _ := os.ReadFile(p); !bytes.Equal(now, was) {
					t.Fatalf("%s changed the host's %s from %q to %q", how, p, was, now)
				}
			}
		}
	})

	// The docker template's root may mount: it can hide /run/cella under a
	// tmpfs of its own with a socket where the agent redials, to take the
	// agent's hello credential and pass for it. The agent dials through the
	// run directory it pinned at boot, so the redial still reaches the
	// daemon and the decoy hears nothing.
	t.Run("OvermountedRunDir", func(t *testing.T) {
		decoy := `import os, socket, subprocess, sys, time
subprocess.run(['mount', '-t', 'tmpfs', 'decoy', '/run/cella'], check=True)
s = socket.socket(socket.AF_UNIX)
s.bind('/run/cella/agent.sock')
s.listen(8)
open('/tmp/decoy.ready', 'w').close()
while True:
    c, _ = s.accept()
    c.settimeout(2)
    try:
        b = c.recv(256)
    except Exception:
        b = b''
    with open('/tmp/decoy.log', 'a') as f:
        f.write('DIALED %r\n' % b)
`
		if err := sb.WriteFile(ctx, "/tmp/decoy.py", "root", strings.NewReader(decoy)); err != nil {
			t.Fatal(err)
		}
		dockerOK(t, sb, "root", "rm -f /tmp/decoy.log /tmp/decoy.ready; setsid python3 /tmp/decoy.py >/tmp/decoy.out 2>&1 < /dev/null & for i in $(seq 100); do [ -e /tmp/decoy.ready ] && break; sleep 0.1; done; [ -e /tmp/decoy.ready ] || { cat /tmp/decoy.out; exit 1; }")
		// A resume from memory breaks the agent's socket (the checkpoint
		// does), so the restored agent dials again — with the overmount and
		// the decoy restored with it.
		if err := env.Client.Pause(ctx, id, true); err != nil {
			t.Fatal(err)
		}
		if _, _, err := env.Client.ConnectResumed(ctx, id); err != nil {
			t.Fatalf("resume with /run/cella overmounted: %v", err)
		}
		res := shT(t, sb, "root", "cat /tmp/decoy.log 2>/dev/null; pgrep -f '[d]ecoy.py' >/dev/null && echo decoy-alive; grep -c ' /run/cella tmpfs' /proc/mounts", time.Minute)
		if strings.Contains(res.Stdout, "DIALED") {
			t.Fatalf("the resumed agent dialed the decoy socket over /run/cella:\n%s", res.Stdout)
		}
		if !strings.Contains(res.Stdout, "decoy-alive") {
			t.Fatalf("the decoy did not survive the resume, so the test proved nothing:\n%s%s", res.Stdout, res.Stderr)
		}
		dockerOK(t, sb, "root", "pkill -f '[d]ecoy.py'; umount /run/cella")
		// A resume from memory restarts the engine (its bridge is gone):
		// the next subtests need it answering again.
		dockerOK(t, sb, "", "for i in $(seq 600); do docker info >/dev/null 2>&1 && ip link show docker0 >/dev/null 2>&1 && break; sleep 0.1; done; docker info >/dev/null")
	})

	t.Run("EgressHoldsForInnerContainers", func(t *testing.T) {
		since := time.Now()
		// TCP goes to the egress proxy, which refuses and logs it; raw ICMP
		// (NET_RAW is in Docker's default set, --net-raw lets the netstack
		// send it) reaches neither the address nor the slot's gateway,
		// whose namespace takes only the proxy's redirected flows.
		res := shT(t, sb, "", "docker run --rm bb:1 sh -c 'echo x | nc 10.1.2.3 80; ping -c 1 -W 2 10.1.2.3; ping -c 1 -W 2 10.200.0.1; echo done'", 2*time.Minute)
		t.Logf("inner container's attempts:\n%s%s", res.Stdout, res.Stderr)
		if strings.Contains(res.Stdout, "bytes from") || !strings.Contains(res.Stdout, "done") {
			t.Fatalf("an inner container's ping left the sandbox, or the attempt did not run:\n%s", res.Stdout)
		}
		a.wantBlockedEntry(t, id, since, blockedWant{kind: "connect", dst: "10.1.2.3:80"})
	})

	// A resume from memory has the engine's processes back but not its
	// bridge (gVisor rebuilds the network from the host's side): the agent
	// restarts the engine, and containers with a restart policy return. A
	// resume without memory boots again on the same files.
	t.Run("PauseResume", func(t *testing.T) {
		dockerOK(t, sb, "", "docker run -d --restart always --name keeper bb:1 sleep 3600")
		for _, keepMemory := range []bool{true, false} {
			if err := env.Client.Pause(ctx, id, keepMemory); err != nil {
				t.Fatal(err)
			}
			if _, _, err := env.Client.ConnectResumed(ctx, id); err != nil {
				t.Fatal(err)
			}
			out := dockerOK(t, sb, "", `for i in $(seq 600); do [ "$(docker inspect -f '{{.State.Running}}' keeper 2>/dev/null)" = true ] && ip link show docker0 >/dev/null 2>&1 && break; sleep 0.1; done; docker run --rm bb:1 echo resumed`)
			if out != "resumed\n" {
				t.Fatalf("docker run after a resume (memory %v): %q", keepMemory, out)
			}
		}
		dockerOK(t, sb, "", "docker rm -f keeper")
	})

	t.Run("KillLeavesNothing", func(t *testing.T) {
		dockerOK(t, sb, "", "docker run -d --name lingering bb:1 sleep 31337.31337")
		if err := env.Client.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			out, _ := exec.Command("pgrep", "-af", "31337.31337|"+id).Output()
			if len(bytes.TrimSpace(out)) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after kill, still on the host:\n%s", out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}

// busyboxImage is a one-layer image of the static busybox at path and its
// applets: a base image made with no registry.
func busyboxImage(t *testing.T, path string) v1.Image {
	t.Helper()
	bin, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"bin/", "tmp/", "etc/", "www/"} {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode})
	}
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin))})
	tw.Write(bin)
	for _, applet := range []string{"sh", "echo", "cat", "ls", "wget", "nc", "ps", "httpd", "sleep", "seq", "ping", "mknod", "mkdir", "mount", "head", "tr", "hostname"} {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox"})
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	// The config first: AppendLayers adds the layer's diffID to it.
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{Architecture: "amd64", OS: "linux", RootFS: v1.RootFS{Type: "layers"},
		Config: v1.Config{Env: []string{"PATH=/bin"}, Cmd: []string{"sh"}}})
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		t.Fatal(err)
	}
	return img
}

// dockerOK runs cmd and fails the test unless it exits 0; it returns
// stdout. Docker under gVisor is slow on a loaded machine: minutes, not
// the usual minute.
func dockerOK(t *testing.T, sb *client.SandboxConn, user, cmd string) string {
	t.Helper()
	res := shT(t, sb, user, cmd, 4*time.Minute)
	if res.ExitCode != 0 {
		t.Fatalf("%s: exit %d\nstdout %s\nstderr %s", cmd, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

func shT(t *testing.T, sb *client.SandboxConn, user, cmd string, timeout time.Duration) client.ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+30*time.Second)
	defer cancel()
	res, err := sb.Exec(ctx, cmd, client.ExecOptions{User: user, Timeout: timeout})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return res
}

func portOf(t *testing.T, addr string) string {
	t.Helper()
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		t.Fatalf("no port in %q", addr)
	}
	return addr[i+1:]
}
