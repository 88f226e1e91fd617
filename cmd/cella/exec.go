package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/cella-sandbox/cella/internal/client"
)

// execFlags are the flags of exec and run.
type execFlags struct {
	asJSON  bool
	timeout time.Duration
	user    string
	cwd     string
	env     []string
}

// register adds the flags; withEnv is false for run, whose --env (from
// create) already reaches every command.
func (f *execFlags) register(fs *pflag.FlagSet, withEnv bool) {
	fs.BoolVar(&f.asJSON, "json", false, `print {"exit_code","stdout","stderr","error","sandbox_events"} when done instead of streaming`)
	fs.DurationVar(&f.timeout, "timeout", 55*time.Second, "command timeout (0 = none)")
	fs.StringVar(&f.user, "user", "", "user to run as: user or root (default: the template's user)")
	fs.StringVar(&f.cwd, "cwd", "", "working directory (default: the user's home)")
	if withEnv {
		fs.StringArrayVar(&f.env, "env", nil, "environment variable K=V (repeatable)")
	}
}

func newExecCmd() *cobra.Command {
	var f execFlags
	cmd := &cobra.Command{
		Use:   "exec [flags] ID -- CMD [ARGS...]",
		Short: "Run a command in a sandbox, streaming its output; exits with its exit code",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			return runExec(cmd.Context(), c, args[0], args[1:], f)
		},
	}
	f.register(cmd.Flags(), true)
	return cmd
}

// shellJoin quotes argv for bash -c so that `cella exec ID -- ls -l "a b"`
// runs exactly those words.
func shellJoin(argv []string) string {
	if len(argv) == 1 {
		return argv[0] // a single argument is a shell command line
	}
	q := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r == '-' || r == '_' || r == '.' || r == '/' || r == '=' || r == ':' || r == ',' || r == '+' ||
				(r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'))
		}) < 0 {
			q[i] = a
			continue
		}
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

func runExec(ctx context.Context, c *client.Client, id string, argv []string, f execFlags) error {
	env, err := parseKV(f.env, "--env")
	if err != nil {
		return err
	}
	if f.timeout < 0 {
		return fmt.Errorf("--timeout must not be negative")
	}
	sb, err := c.Sandbox(ctx, id)
	if err != nil {
		return err
	}
	o := client.ExecOptions{User: f.user, Cwd: f.cwd, Env: env, Timeout: f.timeout}
	if !f.asJSON {
		o.Stdout, o.Stderr = os.Stdout, os.Stderr
	}
	// Pass stdin through only when it is piped in, never from a terminal
	// that would block the command waiting for input nobody types.
	if !term.IsTerminal(int(os.Stdin.Fd())) {
		if st, err := os.Stdin.Stat(); err == nil && (st.Mode()&os.ModeNamedPipe != 0 || st.Mode().IsRegular()) {
			o.Stdin = io.Reader(os.Stdin)
		}
	}
	res, err := sb.Exec(ctx, shellJoin(argv), o)
	if err != nil {
		return err
	}
	if f.asJSON {
		if err := printJSON(res); err != nil {
			return err
		}
		return exitCodeOf(res, false)
	}
	for _, e := range res.SandboxEvents {
		fmt.Fprintln(os.Stderr, "cella: "+e)
	}
	return exitCodeOf(res, true)
}

// exitCodeOf maps a result to cella's exit: the command's own code, 137 for
// a command killed by a signal or a limit (with the named reason).
func exitCodeOf(res client.ExecResult, say bool) error {
	code := res.ExitCode
	msg := ""
	if res.Error != "" && (code < 0 || strings.HasPrefix(res.Error, "killed:") || strings.Contains(res.Error, "limit")) {
		if say {
			msg = res.Error
		}
	}
	if code < 0 {
		code = 137
	}
	if code == 0 && msg == "" {
		return nil
	}
	return &exitError{code: code, msg: msg}
}
