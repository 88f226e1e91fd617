package client

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/cella-sandbox/cella/internal/envd/filesystem"
	"github.com/cella-sandbox/cella/internal/envd/filesystem/filesystemconnect"
	"github.com/cella-sandbox/cella/internal/envd/process"
	"github.com/cella-sandbox/cella/internal/envd/process/processconnect"
)

// SandboxConn reaches the agent of one sandbox through the daemon's proxy.
type SandboxConn struct {
	ID          string
	c           *Client
	accessToken string
	Process     processconnect.ProcessClient
	Filesystem  filesystemconnect.FilesystemClient
}

// headerTransport adds the routing and auth headers to every request.
type headerTransport struct {
	base  http.RoundTripper
	id    string
	token string
	port  int // 0 = the agent's
}

func (t *headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	port := t.port
	if port == 0 {
		port = 49983
	}
	r.Header.Set("E2b-Sandbox-Id", t.id)
	r.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
	if t.token != "" {
		r.Header.Set("X-Access-Token", t.token)
	}
	return t.base.RoundTrip(r)
}

// Sandbox attaches to a running sandbox.
func (c *Client) Sandbox(ctx context.Context, id string) (*SandboxConn, error) {
	d, err := c.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if d.State != "running" {
		msg := fmt.Sprintf("sandbox %s is %s", id, d.State)
		if d.Error != "" {
			msg += ": " + d.Error
		}
		return nil, errors.New(msg)
	}
	return c.attach(id, d.EnvdAccessToken), nil
}

func (c *Client) attach(id, token string) *SandboxConn {
	base := c.http.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hc := &http.Client{Transport: &headerTransport{base: base, id: id, token: token}}
	u := c.base.String()
	return &SandboxConn{
		ID: id, c: c, accessToken: token,
		Process:    processconnect.NewProcessClient(hc, u),
		Filesystem: filesystemconnect.NewFilesystemClient(hc, u),
	}
}

func (s *SandboxConn) httpClient() *http.Client {
	base := s.c.http.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	return &http.Client{Transport: &headerTransport{base: base, id: s.ID, token: s.accessToken}}
}

// ExecOptions configures one command.
type ExecOptions struct {
	User    string // "" = the template's default user
	Cwd     string
	Env     map[string]string
	Timeout time.Duration // 0 = none
	Stdin   io.Reader     // nil = no stdin
	Stdout  io.Writer
	Stderr  io.Writer
}

// ExecResult is how a command ended.
type ExecResult struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	Error    string `json:"error"`
	// SandboxEvents are what the sandbox's network policy blocked while
	// the command ran, each explained.
	SandboxEvents []string `json:"sandbox_events"`

	pid uint32 // the command's process, to find its time window in the audit log
}

func userHeader(user string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
}

// Exec runs argv through bash -l -c like E2B's commands.run, streaming
// output to the writers as it arrives.
func (s *SandboxConn) Exec(ctx context.Context, cmd string, o ExecOptions) (ExecResult, error) {
	started := time.Now()
	res, err := s.exec(ctx, cmd, o)
	if err != nil {
		return res, err
	}
	res.SandboxEvents = []string{}
	// Best effort: a daemon without an audit log just has nothing to add.
	if evs, err := s.c.BlockedDuring(context.WithoutCancel(ctx), s.ID, res.pid, started); err == nil {
		seen := map[string]bool{}
		for _, e := range evs {
			// A resolver asks for A and AAAA: one line says it.
			if line := e.String(); !seen[line] {
				seen[line] = true
				res.SandboxEvents = append(res.SandboxEvents, line)
			}
		}
	}
	return res, nil
}

func (s *SandboxConn) exec(ctx context.Context, cmd string, o ExecOptions) (ExecResult, error) {
	req := &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}, Envs: o.Env},
	}
	if o.Cwd != "" {
		req.Process.Cwd = &o.Cwd
	}
	withStdin := o.Stdin != nil
	req.Stdin = &withStdin
	creq := connect.NewRequest(req)
	if o.User != "" {
		creq.Header().Set("Authorization", userHeader(o.User))
	}
	// The agent takes Connect-Timeout-Ms as the process's lifetime and ends
	// the stream itself (deadline_exceeded, naming the timeout) when it
	// expires, so the client
	// gets a grace period beyond it instead of cutting the stream first.
	if o.Timeout > 0 {
		creq.Header().Set("Connect-Timeout-Ms", strconv.FormatInt(o.Timeout.Milliseconds(), 10))
		// No deadline may reach connect-go: it would turn it into its own
		// Connect-Timeout-Ms and overwrite the one above. So the caller's
		// deadline is dropped (its cancellation still propagates) and a
		// timer gives the agent a grace period to report the timeout itself.
		parent := ctx
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(context.WithoutCancel(parent))
		defer cancel()
		stop := context.AfterFunc(parent, cancel)
		defer stop()
		t := time.AfterFunc(o.Timeout+15*time.Second, cancel)
		defer t.Stop()
	}
	stream, err := s.Process.Start(ctx, creq)
	if err != nil {
		return ExecResult{}, fmt.Errorf("start command: %w", err)
	}
	defer stream.Close()
	var res ExecResult
	var stdout, stderr strings.Builder
	var pid uint32
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		switch {
		case ev.GetStart() != nil:
			pid = ev.GetStart().GetPid()
			if withStdin {
				go s.pumpStdin(context.WithoutCancel(ctx), pid, o.Stdin)
			}
		case ev.GetData() != nil:
			d := ev.GetData()
			if b := d.GetStdout(); len(b) > 0 {
				stdout.Write(b)
				if o.Stdout != nil {
					o.Stdout.Write(b)
				}
			}
			if b := d.GetStderr(); len(b) > 0 {
				stderr.Write(b)
				if o.Stderr != nil {
					o.Stderr.Write(b)
				}
			}
		case ev.GetEnd() != nil:
			e := ev.GetEnd()
			res.ExitCode = int(e.GetExitCode())
			res.Error = e.GetError()
			res.pid = pid
			res.Stdout, res.Stderr = stdout.String(), stderr.String()
			if res.ExitCode == 0 && res.Error != "" && !e.GetExited() {
				res.ExitCode = -1
			}
			return res, nil
		}
	}
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	if err := stream.Err(); err != nil {
		// The agent ends a timed-out command's stream as envd does, with
		// deadline_exceeded naming the timeout; the client's own grace timer
		// covers an agent that could not say so.
		var ce *connect.Error
		if errors.As(err, &ce) && ce.Code() == connect.CodeDeadlineExceeded && o.Timeout > 0 && ctx.Err() == nil {
			res.ExitCode = -1
			res.Error = ce.Message()
			return res, nil
		}
		if (connect.CodeOf(err) == connect.CodeDeadlineExceeded || connect.CodeOf(err) == connect.CodeCanceled) && o.Timeout > 0 && ctx.Err() != nil {
			res.ExitCode = -1
			res.Error = fmt.Sprintf("killed: command timeout %v reached (raise with --timeout)", o.Timeout)
			return res, nil
		}
		if died, ok := s.deathOf(); ok {
			return died, nil
		}
		return res, fmt.Errorf("command stream: %w", err)
	}
	if died, ok := s.deathOf(); ok {
		return died, nil
	}
	return res, errors.New("command stream ended without an exit event")
}

// deathOf turns a stream cut by the sandbox's own death (a limit that took
// the whole sandbox down) into a result that names why.
func (s *SandboxConn) deathOf() (ExecResult, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	// A sandbox brought down by a limit can take a while to die under load
	// (gVisor's sentry starving before its ceiling ends it); a stream broken
	// for another reason leaves the sandbox running, and the caller gets the
	// stream's error after this wait.
	for i := 0; i < 300; i++ {
		d, err := s.c.Get(ctx, s.ID)
		if err == nil && d.State == "dead" && d.Error != "" {
			return ExecResult{ExitCode: -1, Error: d.Error}, true
		}
		if err != nil || d.State != "running" || ctx.Err() != nil {
			return ExecResult{}, false
		}
		time.Sleep(150 * time.Millisecond)
	}
	return ExecResult{}, false
}

func (s *SandboxConn) pumpStdin(ctx context.Context, pid uint32, r io.Reader) {
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			_, serr := s.Process.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
				Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: append([]byte(nil), buf[:n]...)}},
			}))
			if serr != nil {
				return
			}
		}
		if err != nil {
			_, _ = s.Process.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: sel}))
			return
		}
	}
}

// Stat returns a path's entry.
func (s *SandboxConn) Stat(ctx context.Context, path string) (*filesystem.EntryInfo, error) {
	resp, err := s.Filesystem.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: path}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetEntry(), nil
}

func (s *SandboxConn) url(path string, q url.Values) string {
	return s.c.base.String() + path + "?" + q.Encode()
}

func (s *SandboxConn) send(ctx context.Context, method, path string, q url.Values, body io.Reader, ctype string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, s.url(path, q), body)
	if err != nil {
		return nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	// Files travel as they are: Go's transport would otherwise ask for
	// gzip, and the agent would spend more time compressing (incompressible
	// data, often) than the daemon's link takes to carry it.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := s.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the cella daemon: %w", err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, &APIError{Status: resp.StatusCode, Message: strings.TrimSpace(string(b))}
	}
	return resp, nil
}

// WriteFile uploads r as the file at path (as the given user, "" = default).
func (s *SandboxConn) WriteFile(ctx context.Context, path, user string, r io.Reader) error {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	resp, err := s.send(ctx, http.MethodPost, "/files", q, r, "application/octet-stream")
	if err != nil {
		return fmt.Errorf("upload %s: %w", path, err)
	}
	io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// ReadFile downloads the file at path; the caller closes the reader.
func (s *SandboxConn) ReadFile(ctx context.Context, path, user string) (io.ReadCloser, error) {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	resp, err := s.send(ctx, http.MethodGet, "/files", q, nil, "")
	if err != nil {
		return nil, fmt.Errorf("download %s: %w", path, err)
	}
	return resp.Body, nil
}

// PutTar extracts a tar stream into dir.
func (s *SandboxConn) PutTar(ctx context.Context, dir, user string, r io.Reader) error {
	q := url.Values{"path": {dir}}
	if user != "" {
		q.Set("username", user)
	}
	resp, err := s.send(ctx, http.MethodPost, "/cella/tar", q, r, "application/x-tar")
	if err != nil {
		return fmt.Errorf("upload directory to %s: %w", dir, err)
	}
	io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// GetTar streams dir as a tar archive; the caller closes the reader.
func (s *SandboxConn) GetTar(ctx context.Context, dir, user string) (io.ReadCloser, error) {
	q := url.Values{"path": {dir}}
	if user != "" {
		q.Set("username", user)
	}
	resp, err := s.send(ctx, http.MethodGet, "/cella/tar", q, nil, "")
	if err != nil {
		return nil, fmt.Errorf("download directory %s: %w", dir, err)
	}
	return resp.Body, nil
}
