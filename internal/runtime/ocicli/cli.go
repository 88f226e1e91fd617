package ocicli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/cgroup"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// CLI runs one runc-compatible command line against one state dir: every
// call gets Flags (--root first) before its subcommand.
type CLI struct {
	// Name is the command as errors name it: "crun", "runsc".
	Name string
	// Path is the binary.
	Path string
	// Flags come before every subcommand: --root and the runtime's own.
	Flags []string
	// LogFlags returns the flags that send the runtime's own log, as JSON
	// lines, to path.
	LogFlags func(path string) []string
	// ErrorLevels are the log levels whose messages LastError reports;
	// none: a message of any level.
	ErrorLevels []string
	// Timeout bounds each short command (Run).
	Timeout time.Duration
	// Exec runs a command to its end; nil means cmd.Run. (crun runs each
	// one in a private mount namespace.)
	Exec func(cmd *exec.Cmd) error
}

// Command returns the command for args, with the runtime's own log in
// runtimeLog ("": none). Its stdin is empty: the runtime forks a sandbox
// and helpers that must not inherit the caller's.
func (c *CLI) Command(ctx context.Context, runtimeLog string, args ...string) *exec.Cmd {
	a := slices.Clone(c.Flags)
	if runtimeLog != "" && c.LogFlags != nil {
		a = append(a, c.LogFlags(runtimeLog)...)
	}
	cmd := exec.CommandContext(ctx, c.Path, append(a, args...)...)
	cmd.Stdin = nil
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

func (c *CLI) exec(cmd *exec.Cmd) error {
	if c.Exec != nil {
		return c.Exec(cmd)
	}
	return cmd.Run()
}

// Run runs a short command (bounded by Timeout) and returns its stdout;
// its stderr is in the error.
func (c *CLI) Run(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := c.Command(ctx, "", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := c.exec(cmd); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s %s: timed out after %s: %s", c.Name, args[0], c.Timeout, msg)
		}
		return nil, fmt.Errorf("%s %s: %w: %s", c.Name, args[0], err, msg)
	}
	return stdout.Bytes(), nil
}

// State is what `state` and `list --format=json` say of a container.
type State struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Pid    int    `json:"pid"`
	Bundle string `json:"bundle"`
}

// RuntimeStatus maps the OCI status to runtime's.
func (s State) RuntimeStatus() (runtime.Status, error) {
	switch s.Status {
	case "creating", "created":
		return runtime.StatusCreated, nil
	case "running":
		return runtime.StatusRunning, nil
	case "paused":
		return runtime.StatusPaused, nil
	case "stopped":
		return runtime.StatusStopped, nil
	}
	return "", fmt.Errorf("unknown status %q", s.Status)
}

// State runs `state id`.
func (c *CLI) State(ctx context.Context, id string) (State, error) {
	var st State
	out, err := c.Run(ctx, "state", id)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("%s state %s: parse: %w", c.Name, id, err)
	}
	return st, nil
}

// List runs `list --format=json` and returns the container IDs, sorted.
func (c *CLI) List(ctx context.Context) ([]string, error) {
	out, err := c.Run(ctx, "list", "--format=json")
	if err != nil {
		return nil, err
	}
	var sts []State
	if err := json.Unmarshal(out, &sts); err != nil {
		return nil, fmt.Errorf("%s list: parse %q: %w", c.Name, out, err)
	}
	ids := make([]string, 0, len(sts))
	for _, s := range sts {
		ids = append(ids, s.ID)
	}
	slices.Sort(ids)
	return ids, nil
}

// Pause freezes every process of container id (`pause`).
func (c *CLI) Pause(ctx context.Context, id string) error {
	_, err := c.Run(ctx, "pause", id)
	return err
}

// Resume thaws them (`resume`).
func (c *CLI) Resume(ctx context.Context, id string) error {
	_, err := c.Run(ctx, "resume", id)
	return err
}

// Signal sends signal (a name: "KILL", "USR1") to container id's PID 1.
func (c *CLI) Signal(ctx context.Context, id, signal string) error {
	_, err := c.Run(ctx, "kill", id, signal)
	return err
}

// Removal says how Remove finds out about a container.
type Removal struct {
	// Held reports whether the runtime still holds the container: a
	// failed delete of one it no longer holds is no error.
	Held func(ctx context.Context) bool
	// OnlyHeld skips the kill and the delete of a container Held says is
	// not there (crun, whose Held is one stat; runsc's is a `list`).
	OnlyHeld bool
	// ThawFirst thaws a frozen container between its kill and its delete:
	// a frozen task does not die until thawed (crun; runsc's delete ends a
	// paused sandbox itself).
	ThawFirst bool
}

// Remove is the kill-and-delete of runtime.Runtime.Destroy: `kill --all
// KILL`, `delete --force`, then the container's cgroups with whatever
// survived in them (a process that escaped the kill, a wedged sandbox).
// Every step runs even if an earlier one fails, so that a half-dead
// container is still cleaned up.
func (c *CLI) Remove(ctx context.Context, id string, o Removal) error {
	var errs []error
	if !o.OnlyHeld || o.Held(ctx) {
		if _, err := c.Run(ctx, "kill", "--all", id, "KILL"); err != nil {
			slog.Debug(c.Name+": kill", "id", id, "err", err) // usually: already stopped
		}
		if o.ThawFirst {
			if st, err := c.State(ctx, id); err == nil && st.Status == "paused" {
				if err := c.Resume(ctx, id); err != nil {
					slog.Debug(c.Name+": thaw before delete", "id", id, "err", err)
				}
			}
		}
		if _, err := c.Run(ctx, "delete", "--force", id); err != nil && o.Held(ctx) {
			errs = append(errs, err)
		}
	}
	if err := cgroup.Remove(id); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Launch is one detached start of a container from its bundle.
type Launch struct {
	// What names it in errors and logs: "start", "restore".
	What string
	// Args are the subcommand with its flags ("run"; "restore",
	// "--image-path=..."), after any flags of the runtime's own that this
	// start needs; --detach, --bundle, --pid-file and the ID follow.
	Args []string
	// RuntimeLog receives the runtime's own log (in the bundle).
	RuntimeLog string
	// Exec runs the command; nil: the CLI's.
	Exec func(*exec.Cmd) error
	// Destroy removes what a failed start left (the runtime's Destroy).
	Destroy func(ctx context.Context, id string) error
}

// Launch starts spec's container with its stdout and stderr on
// spec.LogPath, opened O_APPEND: runtimes write donated files at their own
// offsets, and only O_APPEND keeps the two streams from overwriting each
// other. A failed start is destroyed (nothing half-created stays: cgroups,
// state, sandbox) and its error carries the runtime log's last error.
func (c *CLI) Launch(ctx context.Context, spec *runtime.Spec, l Launch) error {
	id := spec.ID
	logf, err := os.OpenFile(spec.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	defer logf.Close()
	args := append(slices.Clone(l.Args), "--detach", "--bundle="+spec.BundleDir, "--pid-file="+filepath.Join(spec.BundleDir, "pid"), id)
	cmd := c.Command(ctx, l.RuntimeLog, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	run := c.exec
	if l.Exec != nil {
		run = l.Exec
	}
	start := time.Now()
	if err := run(cmd); err != nil {
		cause := c.LastError(l.RuntimeLog)
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.Timeout)
		defer cancel()
		if derr := l.Destroy(dctx, id); derr != nil {
			slog.Warn(c.Name+": cleanup after failed "+l.What, "id", id, "err", derr)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (%s: %s)", ctx.Err(), c.Name, cause)
		}
		return fmt.Errorf("%s %s: %w: %s", c.Name, subcommand(l.Args), err, cause)
	}
	slog.Debug(c.Name+": container "+l.What, "id", id, "took", time.Since(start))
	return nil
}

// subcommand is the first of args that is no flag.
func subcommand(args []string) string {
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			return a
		}
	}
	return strings.Join(args, " ")
}

// LastError returns the last error message in the runtime's JSON log at
// path: the last message of one of ErrorLevels (of any level without
// them), else the log's last line.
func (c *CLI) LastError(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no " + c.Name + " log)"
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		var m struct{ Msg, Level string }
		if json.Unmarshal(lines[i], &m) == nil && m.Msg != "" && (len(c.ErrorLevels) == 0 || slices.Contains(c.ErrorLevels, m.Level)) {
			return m.Msg
		}
	}
	if last := lines[len(lines)-1]; len(last) > 0 {
		return string(last)
	}
	return "(empty " + c.Name + " log)"
}
