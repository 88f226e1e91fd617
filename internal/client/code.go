package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/cella-sandbox/cella/internal/envd/filesystem"
)

// ListDir lists a directory to the given depth.
func (s *SandboxConn) ListDir(ctx context.Context, path string, depth uint32) ([]*filesystem.EntryInfo, error) {
	resp, err := s.Filesystem.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: path, Depth: depth}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetEntries(), nil
}

// CodeInterpreterPort is where a code-interpreter template serves /execute.
const CodeInterpreterPort = 49999

// CodeResult is what one cell produced.
type CodeResult struct {
	Text   string `json:"text,omitempty"` // the main result's text
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	Error  *struct {
		Name      string `json:"name"`
		Value     string `json:"value"`
		Traceback string `json:"traceback"`
	} `json:"error,omitempty"`
	// Results are the MIME bundles of every result (text, html, png, ...).
	Results []map[string]any `json:"results,omitempty"`
}

// RunCode runs code in the sandbox's code interpreter (port 49999, E2B's
// NDJSON /execute wire format). language "" is the default context's.
func (s *SandboxConn) RunCode(ctx context.Context, code, language string) (CodeResult, error) {
	body := map[string]any{"code": code}
	if language != "" {
		body["language"] = language
	}
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.c.base.String()+"/execute", bytes.NewReader(b))
	if err != nil {
		return CodeResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	base := s.c.http.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hc := &http.Client{Transport: &headerTransport{base: base, id: s.ID, token: s.accessToken, port: CodeInterpreterPort}}
	resp, err := hc.Do(req)
	if err != nil {
		return CodeResult{}, fmt.Errorf("run code: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode == http.StatusBadGateway {
			return CodeResult{}, fmt.Errorf("this sandbox has no code interpreter answering on port %d (create it with template code-interpreter-v1): %s", CodeInterpreterPort, strings.TrimSpace(string(msg)))
		}
		return CodeResult{}, &APIError{Status: resp.StatusCode, Message: strings.TrimSpace(string(msg))}
	}
	var out CodeResult
	var stdout, stderr strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			continue
		}
		switch m["type"] {
		case "stdout":
			stdout.WriteString(fmt.Sprint(m["text"]))
		case "stderr":
			stderr.WriteString(fmt.Sprint(m["text"]))
		case "result":
			delete(m, "type")
			out.Results = append(out.Results, m)
			if main, _ := m["is_main_result"].(bool); main {
				if t, ok := m["text"].(string); ok {
					out.Text = t
				}
			}
		case "error":
			var e struct {
				Name      string `json:"name"`
				Value     string `json:"value"`
				Traceback string `json:"traceback"`
			}
			raw, _ := json.Marshal(m)
			_ = json.Unmarshal(raw, &e)
			out.Error = &e
		}
	}
	out.Stdout, out.Stderr = stdout.String(), stderr.String()
	return out, sc.Err()
}
