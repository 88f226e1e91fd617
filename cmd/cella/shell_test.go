package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// lockedBuf collects a pty's output.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func waitOutput(t *testing.T, out *lockedBuf, s string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if strings.Contains(out.String(), s) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no %q within %v; terminal shows:\n%q", s, d, out.String())
}

// TestShellWaitExpose drives `cella shell` under a real pseudo-terminal and
// runs `cella wait` and `cella expose` against a gVisor sandbox.
func TestShellWaitExpose(t *testing.T) {
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{})
	bin, _ := daemontest.Binaries(t)
	ctx := context.Background()
	sbx, err := env.Client.Create(ctx, client.CreateRequest{Timeout: new(int64(300))})
	if err != nil {
		t.Fatal(err)
	}
	id := sbx.SandboxID
	cliEnv := append(os.Environ(), "CELLA_URL="+env.URL, "CELLA_API_KEY="+env.APIKey)

	t.Run("Shell", func(t *testing.T) {
		cmd := exec.Command(bin, "shell", id)
		cmd.Env = cliEnv
		ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 30, Cols: 90})
		if err != nil {
			t.Fatal(err)
		}
		defer ptmx.Close()
		out := &lockedBuf{}
		go func() { _, _ = io.Copy(out, ptmx) }()
		_, _ = ptmx.Write([]byte("stty size\r"))
		waitOutput(t, out, "30 90", 20*time.Second)
		// Resizing the local terminal reaches the sandbox's pty.
		if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 41, Cols: 123}); err != nil {
			t.Fatal(err)
		}
		// The resize travels on its own (SIGWINCH, then a control frame):
		// ask again until the sandbox's pty has it.
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), "41 123"); {
			if time.Now().After(deadline) {
				t.Fatalf("the resize to 41x123 never reached the sandbox; terminal:\n%q", out.String())
			}
			_, _ = ptmx.Write([]byte("stty size\r"))
			time.Sleep(500 * time.Millisecond)
		}
		// Ctrl-C goes to the sandbox, not to the local cella: sent once
		// the foreground job, which becomes the sleep, has printed the
		// marker (computed, so the echoed command line cannot match it).
		_, _ = ptmx.Write([]byte("sh -c 'echo sleeping-$((2+3)); exec sleep 100'\r"))
		waitOutput(t, out, "sleeping-5", 10*time.Second)
		_, _ = ptmx.Write([]byte{3})
		_, _ = ptmx.Write([]byte("echo after-$((1+1))\r"))
		waitOutput(t, out, "after-2", 10*time.Second)
		_, _ = ptmx.Write([]byte("exit 7\r"))
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 7 {
				t.Fatalf("cella shell exit: %v, want exit code 7; terminal:\n%q", err, out.String())
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("cella shell did not exit; terminal:\n%q", out.String())
		}
	})

	run := func(args ...string) (string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Env = cliEnv
		var b bytes.Buffer
		cmd.Stdout, cmd.Stderr = &b, &b
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return b.String(), code
	}

	t.Run("WaitExpose", func(t *testing.T) {
		if out, code := run("exec", id, "--", "bash", "-c", "mkdir -p /tmp/e && cd /tmp/e && echo exposed > index.html && (sleep 1; exec python3 -m http.server 8125) >/dev/null 2>&1 &"); code != 0 {
			t.Fatalf("exec: %d %s", code, out)
		}
		out, code := run("wait", id, "--port", "8125", "--timeout", "20s")
		if code != 0 || !strings.Contains(out, "port 8125 is listening") {
			t.Fatalf("cella wait: %d %s", code, out)
		}
		out, code = run("wait", id, "--port", "8999", "--timeout", "1s")
		if code != 124 || !strings.Contains(out, "timeout") {
			t.Fatalf("cella wait on a closed port: want exit 124 naming the timeout, got %d %s", code, out)
		}
		out, code = run("expose", id, "8125")
		u, _ := url.Parse(env.URL)
		want := fmt.Sprintf("http://8125-%s.cella.test:%s/", id, u.Port())
		if code != 0 || !strings.Contains(out, want) || !strings.Contains(out, "Host: 8125-"+id+".cella.test") {
			t.Fatalf("cella expose: %d %s (want %s)", code, out, want)
		}
		// The printed no-DNS form works.
		curl := exec.Command("curl", "-sf", "-H", "Host: 8125-"+id+".cella.test", env.URL+"/index.html")
		if b, err := curl.Output(); err != nil || string(b) != "exposed\n" {
			t.Fatalf("curl through the printed form: %q %v", b, err)
		}
	})
}
