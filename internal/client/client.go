// Package client is the Go client of a cella daemon: the REST API for
// lifecycle, and the sandbox proxy for commands and files (Connect RPC to
// the agent, the same path E2B's SDKs take). The CLI and the tests use it.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/apiwire"
)

// Config says where the daemon is and how to authenticate.
type Config struct {
	URL    string // e.g. http://127.0.0.1:3000
	APIKey string
	HTTP   *http.Client
}

// FromEnv builds a Config the way the CLI documents it: CELLA_URL (default
// http://127.0.0.1:3000); the key from CELLA_API_KEY, else E2B_API_KEY,
// else <data-dir>/admin.key (data dir from CELLA_DATA_DIR, default
// /var/lib/cella).
func FromEnv() (Config, error) {
	cfg := Config{URL: os.Getenv("CELLA_URL")}
	if cfg.URL == "" {
		cfg.URL = "http://127.0.0.1:3000"
	}
	cfg.APIKey = os.Getenv("CELLA_API_KEY")
	if cfg.APIKey == "" {
		cfg.APIKey = os.Getenv("E2B_API_KEY")
	}
	if cfg.APIKey == "" {
		dataDir := os.Getenv("CELLA_DATA_DIR")
		if dataDir == "" {
			dataDir = "/var/lib/cella"
		}
		b, err := os.ReadFile(filepath.Join(dataDir, "admin.key"))
		if err != nil {
			return cfg, fmt.Errorf("no API key: set CELLA_API_KEY (or E2B_API_KEY), or run as a user who can read %s/admin.key", dataDir)
		}
		cfg.APIKey = strings.TrimSpace(string(b))
	}
	return cfg, nil
}

// Client talks to one daemon.
type Client struct {
	base   *url.URL
	apiKey string
	http   *http.Client
}

// New makes a client.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(cfg.URL, "/"))
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("invalid daemon URL %q", cfg.URL)
	}
	hc := cfg.HTTP
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{
			Proxy:               nil, // sandbox traffic goes to the daemon, never via a proxy
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	return &Client{base: u, apiKey: cfg.APIKey, http: hc}, nil
}

// APIError is a non-2xx answer of the daemon.
type APIError struct {
	Status  int
	Message string
}

func (e *APIError) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Message) }

// IsNotFound reports whether err is a 404 from the daemon.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base.String()+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-API-Key", c.apiKey)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the cella daemon at %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp, fmt.Errorf("read answer of %s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		return resp, apiErrorFrom(resp.StatusCode, data)
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return resp, fmt.Errorf("decode answer of %s %s: %w", method, path, err)
		}
	}
	return resp, nil
}

// CreateRequest is the body of POST /v2/sandboxes.
type CreateRequest = apiwire.NewSandboxV2

// Sandbox is the answer of create and connect.
type Sandbox = apiwire.Sandbox

// Detail is GET /sandboxes/{id}: the fields the client reads, the network
// raw and the whole answer in Raw (cella info --json prints it as the
// daemon sent it). Not apiwire.SandboxDetail: its network's rules are the
// daemon's egress rules as they are, which a typed decode would hold to one
// version of their shape.
type Detail struct {
	Sandbox
	Metadata      map[string]string `json:"metadata"`
	StartedAt     time.Time         `json:"startedAt"`
	EndAt         time.Time         `json:"endAt"`
	State         string            `json:"state"`
	CPUCount      float64           `json:"cpuCount"`
	MemoryMB      int64             `json:"memoryMB"`
	DiskSizeMB    int64             `json:"diskSizeMB"`
	PidsLimit     int64             `json:"pidsLimit"`
	DiskUsedBytes int64             `json:"diskUsedBytes"`
	Runtime       string            `json:"runtime"`
	Error         string            `json:"error"`
	PauseMode     string            `json:"pauseMode"`
	Network       json.RawMessage   `json:"network"`
	Raw           json.RawMessage   `json:"-"`
}

// Create makes a sandbox.
func (c *Client) Create(ctx context.Context, req CreateRequest) (Sandbox, error) {
	var sb Sandbox
	_, err := c.do(ctx, http.MethodPost, "/v2/sandboxes", req, &sb)
	return sb, err
}

// Get returns a sandbox's detail.
func (c *Client) Get(ctx context.Context, id string) (Detail, error) {
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, &raw); err != nil {
		return Detail{}, err
	}
	var d Detail
	if err := json.Unmarshal(raw, &d); err != nil {
		return d, err
	}
	d.Raw = raw
	return d, nil
}

// List returns the running (and paused) sandboxes.
func (c *Client) List(ctx context.Context) ([]Detail, error) {
	return c.ListStates(ctx, "")
}

// ListStates returns the sandboxes in the given states, comma-separated
// ("running,paused,dead"); "" is the API's default, running and paused.
func (c *Client) ListStates(ctx context.Context, states string) ([]Detail, error) {
	var out []Detail
	next := ""
	for {
		path := "/v2/sandboxes?limit=100"
		if states != "" {
			path += "&state=" + url.QueryEscape(states)
		}
		if next != "" {
			path += "&nextToken=" + url.QueryEscape(next)
		}
		var page []Detail
		resp, err := c.do(ctx, http.MethodGet, path, nil, &page)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		next = resp.Header.Get("X-Next-Token")
		if next == "" {
			return out, nil
		}
	}
}

// Kill destroys a sandbox.
func (c *Client) Kill(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil, nil)
	return err
}

// SetTimeout makes a sandbox expire d from now.
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	secs := int64((d + time.Second - 1) / time.Second)
	_, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/timeout", map[string]int64{"timeout": secs}, nil)
	return err
}

// Connect returns the sandbox's connection details (and extends its TTL to
// at least the default). A paused sandbox is resumed first.
func (c *Client) Connect(ctx context.Context, id string) (Sandbox, error) {
	sb, _, err := c.ConnectResumed(ctx, id)
	return sb, err
}

// ConnectResumed is Connect that also says whether the sandbox was paused
// and has been resumed (201) rather than running already (200).
func (c *Client) ConnectResumed(ctx context.Context, id string) (Sandbox, bool, error) {
	var sb Sandbox
	resp, err := c.do(ctx, http.MethodPost, "/v2/sandboxes/"+url.PathEscape(id)+"/connect", apiwire.ConnectSandboxV2{}, &sb)
	return sb, err == nil && resp.StatusCode == http.StatusCreated, err
}

// Pause pauses a sandbox; keepMemory=false keeps only its filesystem.
func (c *Client) Pause(ctx context.Context, id string, keepMemory bool) error {
	var body apiwire.SandboxPauseRequest
	if !keepMemory {
		body.Memory = new(false)
	}
	_, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/pause", body, nil)
	return err
}

// IsConflict reports whether err is a 409 from the daemon (e.g. already
// paused).
func IsConflict(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusConflict
}
