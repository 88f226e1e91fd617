// Package mcpserver exposes cella to agents as an MCP server (the official Go
// SDK): `cella mcp` over stdio and /mcp on the daemon over streamable HTTP.
// Every tool acts through the daemon's own API with the caller's key, so MCP
// gets exactly the same isolation, limits and errors as the SDKs and the CLI.
package mcpserver

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cella-sandbox/cella/internal/client"
)

// Config configures one MCP server (one per MCP session).
type Config struct {
	// Client reaches the daemon with the caller's API key.
	Client *client.Client
	// DaemonURL is the daemon's base URL, for preview URLs.
	DaemonURL string
	// MaxCalls is the session's tool-call budget (0 = unlimited).
	MaxCalls int64
	// Version is reported to clients.
	Version string
	// Network says what the caller's sandboxes may reach (the key's egress
	// ceiling, from GET /keys/self); empty is "unknown: assume none".
	Network string
}

// policy is what tool descriptions tell agents about the sandbox they get,
// because agents plan from them.
func policyText(network string) string {
	if network == "" {
		network = "none known: assume a sandbox cannot reach the network"
	}
	return `Sandboxes are disposable Linux machines (Debian bookworm with bash, python3, pip, nodejs, npm, git, curl) isolated by gVisor. ` +
		`Network egress: ` + network + `. A sandbox never reaches the host or other sandboxes; a blocked connection fails fast (plain HTTP gets a 403 that explains it) and sandbox_events names it. ` +
		policyLimits
}

const policyLimits = `Defaults: 1 CPU, 512 MiB memory, 256 processes, 1 GiB disk, 10 MiB output per command, 60 s per command, sandbox lifetime 5 min; ` +
	`a command over a limit is killed and the result names the limit and how to raise it (sandbox_create takes memory_mb, cpus, disk_mb, pids and timeout_seconds; sandbox_exec takes timeout_seconds).`

// New builds the MCP server with cella's tools.
func New(cfg Config) *mcp.Server {
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	policy := policyText(cfg.Network)
	s := mcp.NewServer(&mcp.Implementation{Name: "cella", Version: cfg.Version}, &mcp.ServerOptions{
		Instructions: "cella runs untrusted code in isolated sandboxes. Create a sandbox, run commands or code in it, move files in and out, and kill it when done. " + policy,
	})
	t := &tools{cfg: cfg}
	add(s, t, "sandbox_create", "Create a sandbox and return its ID. "+policy, t.create)
	add(s, t, "sandbox_exec", "Run a shell command (bash -l -c) in a sandbox as user `user` in /home/user and return exit_code, stdout, stderr, error (the named limit when one was hit) and sandbox_events. A non-zero exit code is a normal result. "+policy, t.exec)
	add(s, t, "sandbox_write_file", "Write a UTF-8 text file in a sandbox (parent directories are created; the file is owned by `user`).", t.writeFile)
	add(s, t, "sandbox_read_file", "Read a file from a sandbox as UTF-8 text (at most 1 MiB).", t.readFile)
	add(s, t, "sandbox_list_files", "List a directory in a sandbox (depth 1 by default).", t.listFiles)
	add(s, t, "sandbox_run_code", "Run Python or JavaScript in a sandbox's long-lived code context (variables persist between calls); the sandbox must be created with template code-interpreter-v1. Returns text, stdout, stderr and error.", t.runCode)
	add(s, t, "sandbox_expose_port", "Return the preview URL through which a port a sandbox process listens on is reachable (HTTP and WebSocket, through the cella daemon).", t.exposePort)
	add(s, t, "sandbox_kill", "Kill a sandbox and remove everything it had.", t.kill)
	add(s, t, "sandbox_list", "List your running sandboxes.", t.list)
	return s
}

type tools struct {
	cfg   Config
	calls atomic.Int64
}

// add registers a tool behind the session's call budget.
func add[In, Out any](s *mcp.Server, t *tools, name, desc string, h func(context.Context, In) (Out, error)) {
	mcp.AddTool(s, &mcp.Tool{Name: name, Description: desc}, func(ctx context.Context, _ *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		var zero Out
		if n := t.calls.Add(1); t.cfg.MaxCalls > 0 && n > t.cfg.MaxCalls {
			return nil, zero, fmt.Errorf("call budget exhausted: this MCP session may make %d tool calls (max_calls); start a new session, or ask the operator to raise --mcp-max-calls", t.cfg.MaxCalls)
		}
		out, err := h(ctx, in)
		return nil, out, err
	})
}

type createIn struct {
	Template       string            `json:"template,omitempty" jsonschema:"template to start from (default base; code-interpreter-v1 for sandbox_run_code)"`
	TimeoutSeconds int64             `json:"timeout_seconds,omitempty" jsonschema:"sandbox lifetime in seconds (default 300)"`
	CPUs           float64           `json:"cpus,omitempty" jsonschema:"CPU limit in cores (default 1)"`
	MemoryMB       int64             `json:"memory_mb,omitempty" jsonschema:"memory limit in MiB (default 512)"`
	DiskMB         int64             `json:"disk_mb,omitempty" jsonschema:"writable disk in MiB (default 1024)"`
	Pids           int64             `json:"pids,omitempty" jsonschema:"process limit (default 256)"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables for every command"`
}

type createOut struct {
	SandboxID string `json:"sandbox_id"`
	Template  string `json:"template"`
	EndsAt    string `json:"ends_at"`
}

func (t *tools) create(ctx context.Context, in createIn) (createOut, error) {
	req := client.CreateRequest{
		TemplateID: in.Template, CPUCount: in.CPUs, MemoryMB: in.MemoryMB,
		DiskSizeMB: in.DiskMB, PidsLimit: in.Pids, EnvVars: in.Env,
	}
	if in.TimeoutSeconds != 0 {
		req.Timeout = &in.TimeoutSeconds // 0 is left out: the daemon's default
	}
	sb, err := t.cfg.Client.Create(ctx, req)
	if err != nil {
		return createOut{}, err
	}
	d, err := t.cfg.Client.Get(ctx, sb.SandboxID)
	if err != nil {
		return createOut{}, err
	}
	return createOut{SandboxID: sb.SandboxID, Template: sb.TemplateID, EndsAt: d.EndAt.Format(time.RFC3339)}, nil
}

type execIn struct {
	SandboxID      string            `json:"sandbox_id"`
	Command        string            `json:"command" jsonschema:"shell command line"`
	Cwd            string            `json:"cwd,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	TimeoutSeconds int64             `json:"timeout_seconds,omitempty" jsonschema:"command timeout in seconds (default 60, 0 = the default)"`
	User           string            `json:"user,omitempty" jsonschema:"user or root (default user)"`
}

// maxExecSeconds bounds sandbox_exec's timeout_seconds: a day, the longest
// a sandbox lives.
const maxExecSeconds = 24 * 60 * 60

type execOut struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	Error    string `json:"error,omitempty"`
	// SandboxEvents are what the sandbox's policy did during the command
	// (blocked connections and the like); empty while sandboxes have no
	// network at all.
	SandboxEvents []string `json:"sandbox_events"`
}

func (t *tools) exec(ctx context.Context, in execIn) (execOut, error) {
	sb, err := t.cfg.Client.Sandbox(ctx, in.SandboxID)
	if err != nil {
		return execOut{}, err
	}
	timeout := 60 * time.Second
	switch {
	case in.TimeoutSeconds < 0 || in.TimeoutSeconds > maxExecSeconds:
		// Checked here: the seconds become a duration, which a larger
		// number would wrap around.
		return execOut{}, fmt.Errorf("timeout_seconds must be between 0 and %d (got %d)", maxExecSeconds, in.TimeoutSeconds)
	case in.TimeoutSeconds > 0:
		timeout = time.Duration(in.TimeoutSeconds) * time.Second
	}
	res, err := sb.Exec(ctx, in.Command, client.ExecOptions{User: in.User, Cwd: in.Cwd, Env: in.Env, Timeout: timeout})
	if err != nil {
		return execOut{}, err
	}
	return execOut{ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr, Error: res.Error, SandboxEvents: res.SandboxEvents}, nil
}

type writeIn struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path" jsonschema:"absolute, or relative to /home/user"`
	Content   string `json:"content"`
}

type writeOut struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

func (t *tools) writeFile(ctx context.Context, in writeIn) (writeOut, error) {
	sb, err := t.cfg.Client.Sandbox(ctx, in.SandboxID)
	if err != nil {
		return writeOut{}, err
	}
	if err := sb.WriteFile(ctx, in.Path, "", strings.NewReader(in.Content)); err != nil {
		return writeOut{}, err
	}
	return writeOut{Path: in.Path, Bytes: len(in.Content)}, nil
}

type readIn struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path"`
}

type readOut struct {
	Content   string `json:"content"`
	Truncated bool   `json:"truncated"`
}

const maxRead = 1 << 20

func (t *tools) readFile(ctx context.Context, in readIn) (readOut, error) {
	sb, err := t.cfg.Client.Sandbox(ctx, in.SandboxID)
	if err != nil {
		return readOut{}, err
	}
	r, err := sb.ReadFile(ctx, in.Path, "")
	if err != nil {
		return readOut{}, err
	}
	defer r.Close()
	buf := make([]byte, maxRead+1)
	n, _ := readFull(r, buf)
	return readOut{Content: string(buf[:min(n, maxRead)]), Truncated: n > maxRead}, nil
}

type listIn struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path"`
	Depth     uint32 `json:"depth,omitempty"`
}

type entry struct {
	Name string `json:"name"`
	Path string `json:"path"`
	Type string `json:"type"`
	Size int64  `json:"size"`
}

type listOut struct {
	Entries []entry `json:"entries"`
}

func (t *tools) listFiles(ctx context.Context, in listIn) (listOut, error) {
	sb, err := t.cfg.Client.Sandbox(ctx, in.SandboxID)
	if err != nil {
		return listOut{}, err
	}
	depth := in.Depth
	if depth == 0 {
		depth = 1
	}
	entries, err := sb.ListDir(ctx, in.Path, depth)
	if err != nil {
		return listOut{}, err
	}
	out := listOut{Entries: []entry{}}
	for _, e := range entries {
		typ := strings.ToLower(strings.TrimPrefix(e.GetType().String(), "FILE_TYPE_"))
		if typ == "directory" {
			typ = "dir"
		}
		out.Entries = append(out.Entries, entry{Name: e.GetName(), Path: e.GetPath(), Type: typ, Size: e.GetSize()})
	}
	return out, nil
}

type portIn struct {
	SandboxID string `json:"sandbox_id"`
	Port      int    `json:"port"`
}

type portOut struct {
	URL  string `json:"url"`
	Host string `json:"host"`
	Note string `json:"note"`
}

func (t *tools) exposePort(ctx context.Context, in portIn) (portOut, error) {
	if in.Port <= 0 || in.Port > 65535 {
		return portOut{}, fmt.Errorf("port must be 1-65535 (got %d)", in.Port)
	}
	d, err := t.cfg.Client.Get(ctx, in.SandboxID)
	if err != nil {
		return portOut{}, err
	}
	u, err := url.Parse(t.cfg.DaemonURL)
	if err != nil {
		return portOut{}, err
	}
	host := strconv.Itoa(in.Port) + "-" + d.SandboxID + "." + d.Domain
	full := host
	if p := u.Port(); p != "" {
		full += ":" + p
	}
	return portOut{
		URL: u.Scheme + "://" + full + "/", Host: host,
		Note: "Requests reach the port only while a process in the sandbox listens on it (0.0.0.0 or 127.0.0.1). Without DNS for *." + d.Domain + ", send the request to the daemon with the Host header set to the host above.",
	}, nil
}

type idIn struct {
	SandboxID string `json:"sandbox_id"`
}

type killOut struct {
	Killed bool `json:"killed"`
}

func (t *tools) kill(ctx context.Context, in idIn) (killOut, error) {
	if err := t.cfg.Client.Kill(ctx, in.SandboxID); err != nil {
		return killOut{}, err
	}
	return killOut{Killed: true}, nil
}

type listedSandbox struct {
	SandboxID string `json:"sandbox_id"`
	Template  string `json:"template"`
	State     string `json:"state"`
	EndsAt    string `json:"ends_at"`
}

type sandboxesOut struct {
	Sandboxes []listedSandbox `json:"sandboxes"`
}

func (t *tools) list(ctx context.Context, _ struct{}) (sandboxesOut, error) {
	all, err := t.cfg.Client.List(ctx)
	if err != nil {
		return sandboxesOut{}, err
	}
	out := sandboxesOut{Sandboxes: []listedSandbox{}}
	for _, d := range all {
		out.Sandboxes = append(out.Sandboxes, listedSandbox{SandboxID: d.SandboxID, Template: d.TemplateID, State: d.State, EndsAt: d.EndAt.Format(time.RFC3339)})
	}
	return out, nil
}

type codeIn struct {
	SandboxID string `json:"sandbox_id"`
	Code      string `json:"code"`
	Language  string `json:"language,omitempty" jsonschema:"python (default) or javascript"`
}

func (t *tools) runCode(ctx context.Context, in codeIn) (client.CodeResult, error) {
	sb, err := t.cfg.Client.Sandbox(ctx, in.SandboxID)
	if err != nil {
		return client.CodeResult{}, err
	}
	return sb.RunCode(ctx, in.Code, in.Language)
}

func readFull(r io.Reader, buf []byte) (int, error) { return io.ReadFull(r, buf) }
