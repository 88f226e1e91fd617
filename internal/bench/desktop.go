package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/apiwire"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/template"
)

// desktopStart is what @e2b/desktop's Sandbox.create() runs in a new
// desktop sandbox after the create call (its _start and startXfce4), with
// its waits done inside one command: Xvfb :0, then startxfce4, then until
// the session, the window manager and the desktop run.
const desktopStart = `(setsid Xvfb :0 -ac -screen 0 1024x768x24 -retro -dpi 96 -nolisten tcp -nolisten unix </dev/null >/dev/null 2>&1 &)
for i in $(seq 1 200); do xdpyinfo >/dev/null 2>&1 && break; sleep 0.05; done
(setsid startxfce4 </dev/null >/dev/null 2>&1 &)
for i in $(seq 1 1200); do pgrep -x xfce4-session >/dev/null && pgrep -x xfwm4 >/dev/null && pgrep -x xfdesktop >/dev/null && exit 0; sleep 0.05; done
exit 1`

// Desktop measures the desktop template (computer use) under gVisor beside
// base in the same daemon: create → first screenshot (the SDK's create
// and its start of Xvfb and Xfce, then screenshot(): `scrot --pointer`
// and the PNG read back), the screenshot round trip of a running desktop,
// the create call alone, and the idle memory of a desktop sandbox once
// its session is up (cgroup charge and PSS) beside an idle base sandbox.
func Desktop(ctx context.Context, cfg Config) ([]Figure, error) {
	n := cfg.N
	if n <= 0 {
		n = 5
	}
	tpls, _, err := ensureBase(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := tpls.EnsureNamed(ctx, template.DesktopName, cfg.Out); err != nil {
		return nil, err
	}
	l, err := startLocal(ctx, cfg, runtime.GVisor)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	c := l.Client
	rt := runtime.GVisor
	desktop := client.CreateRequest{TemplateID: template.DesktopName, EnvVars: apiwire.EnvVars{"DISPLAY": ":0"}}

	var firsts, createCalls, baseCalls, shots []time.Duration
	var desktopMem, basePSS, baseMem, desktopPSS int64
	var lastErr error
	for i := 0; i < n; i++ {
		t0 := time.Now()
		sb, err := c.Create(ctx, desktop)
		if err != nil {
			lastErr = err
			continue
		}
		createCalls = append(createCalls, time.Since(t0))
		err = func() error {
			defer func() { _ = c.Kill(ctx, sb.SandboxID) }()
			conn, err := c.Sandbox(ctx, sb.SandboxID)
			if err != nil {
				return err
			}
			if res, err := conn.Exec(ctx, desktopStart, client.ExecOptions{Timeout: 2 * time.Minute}); err != nil || res.ExitCode != 0 {
				return fmt.Errorf("start the desktop: %v %s%s", err, res.Stdout, res.Stderr)
			}
			if _, err := screenshot(ctx, conn); err != nil {
				return err
			}
			firsts = append(firsts, time.Since(t0))
			if i > 0 {
				return nil
			}
			// The first sandbox also gives the round trips and, once the
			// session has settled, its idle memory.
			for j := 0; j < max(n, 5); j++ {
				t := time.Now()
				if _, err := screenshot(ctx, conn); err != nil {
					return err
				}
				shots = append(shots, time.Since(t))
			}
			time.Sleep(2 * time.Second)
			desktopMem, desktopPSS = cgroupCharge(sb.SandboxID), sandboxPSS(sb.SandboxID)
			return nil
		}()
		if err != nil {
			lastErr = err
		}
	}
	for i := 0; i < n; i++ {
		t0 := time.Now()
		sb, err := c.Create(ctx, client.CreateRequest{})
		if err != nil {
			lastErr = err
			continue
		}
		baseCalls = append(baseCalls, time.Since(t0))
		if i == 0 {
			time.Sleep(2 * time.Second)
			baseMem, basePSS = cgroupCharge(sb.SandboxID), sandboxPSS(sb.SandboxID)
		}
		_ = c.Kill(ctx, sb.SandboxID)
	}

	baseCall := summarize("create call, base", rt, baseCalls)
	call := summarize("create call, desktop", rt, createCalls)
	call.against(baseCall)
	first := summarize("desktop create → Xfce up → first screenshot", rt, firsts)
	first.against(baseCall)
	shot := summarize("desktop screenshot round trip (scrot + download)", rt, shots)
	mem := Figure{Name: "idle memory, desktop session up", Runtime: rt, N: 1,
		Extra: fmt.Sprintf("%.1f MB cgroup charge (%.1f MB PSS); base %.1f MB (%.1f MB PSS), %.1f×",
			float64(desktopMem)/1e6, float64(desktopPSS)/1e6, float64(baseMem)/1e6, float64(basePSS)/1e6, ratio(desktopMem, baseMem))}
	figs := []Figure{baseCall, call, first, shot, mem}
	if lastErr != nil && len(firsts) == 0 {
		return figs, lastErr
	}
	if lastErr != nil {
		first.Err = lastErr.Error()
		figs[2] = first
	}
	return figs, nil
}

// screenshot is the SDK's screenshot(): scrot into a file, read back, and
// checked to be a PNG.
func screenshot(ctx context.Context, conn *client.SandboxConn) (int, error) {
	path := "/tmp/bench-shot.png"
	if res, err := conn.Exec(ctx, "scrot --overwrite --pointer "+path, client.ExecOptions{}); err != nil || res.ExitCode != 0 {
		return 0, fmt.Errorf("scrot: %v %s", err, strings.TrimSpace(res.Stderr))
	}
	r, err := conn.ReadFile(ctx, path, "")
	if err != nil {
		return 0, err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return 0, err
	}
	if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		return 0, fmt.Errorf("screenshot is not a PNG (%d bytes)", len(b))
	}
	return len(b), nil
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
