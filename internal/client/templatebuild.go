package client

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/build"
)

// Template builds through E2B's build API (../shared/e2b-template-api.md
// §2): what `cella template build -f/--run` speaks to the daemon, as E2B's
// SDK does.

// TemplateBuilds runs builds over the API and remembers the template IDs
// of the names it built (to remove intermediate stages).
type TemplateBuilds struct {
	C *Client
	// Log receives the build's log entries as they are polled.
	Log func(build.LogEntry)

	mu  sync.Mutex
	ids map[string]string // name → templateID
}

type buildStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	Force     bool     `json:"force"`
	FilesHash string   `json:"filesHash,omitempty"`
}

// Build requests, uploads the files of, triggers and follows one build.
func (tb *TemplateBuilds) Build(ctx context.Context, spec build.Spec, files build.Files) error {
	req := map[string]any{"name": spec.Name}
	if spec.CPUs > 0 {
		req["cpuCount"] = spec.CPUs
	}
	if spec.MemoryMB > 0 {
		req["memoryMB"] = spec.MemoryMB
	}
	var created struct {
		TemplateID string `json:"templateID"`
		BuildID    string `json:"buildID"`
	}
	if _, err := tb.C.do(ctx, http.MethodPost, "/v3/templates", req, &created); err != nil {
		return fmt.Errorf("request build of %s: %w", spec.Name, err)
	}
	tb.mu.Lock()
	if tb.ids == nil {
		tb.ids = map[string]string{}
	}
	tb.ids[spec.Name] = created.TemplateID
	tb.mu.Unlock()
	tid := url.PathEscape(created.TemplateID)
	steps := make([]buildStep, 0, len(spec.Steps))
	uploaded := map[string]bool{}
	for _, st := range spec.Steps {
		steps = append(steps, buildStep{Type: st.Type, Args: st.Args, Force: st.Force || spec.Force, FilesHash: st.FilesHash})
		if st.FilesHash == "" || uploaded[st.FilesHash] {
			continue
		}
		uploaded[st.FilesHash] = true
		var link struct {
			Present bool   `json:"present"`
			URL     string `json:"url"`
		}
		if _, err := tb.C.do(ctx, http.MethodGet, "/templates/"+tid+"/files/"+st.FilesHash, nil, &link); err != nil {
			return fmt.Errorf("files link: %w", err)
		}
		if link.Present || link.URL == "" {
			continue
		}
		if err := tb.upload(ctx, files, st.FilesHash, link.URL); err != nil {
			return err
		}
	}
	trigger := map[string]any{"steps": steps, "force": spec.Force}
	if spec.Base.Template != "" {
		trigger["fromTemplate"] = spec.Base.Template
	} else {
		trigger["fromImage"] = spec.Base.Image
		if spec.Base.Username != "" {
			trigger["fromImageRegistry"] = map[string]string{"type": "registry", "username": spec.Base.Username, "password": spec.Base.Password}
		}
	}
	if spec.StartCmd != "" {
		trigger["startCmd"] = spec.StartCmd
	}
	if spec.ReadyCmd != "" {
		trigger["readyCmd"] = spec.ReadyCmd
	}
	if _, err := tb.C.do(ctx, http.MethodPost, "/v2/templates/"+tid+"/builds/"+url.PathEscape(created.BuildID), trigger, nil); err != nil {
		return fmt.Errorf("start build of %s: %w", spec.Name, err)
	}
	return tb.follow(ctx, tid, url.PathEscape(created.BuildID))
}

// upload PUTs the archive to the daemon's signed URL (relative URLs are
// the daemon's).
func (tb *TemplateBuilds) upload(ctx context.Context, files build.Files, hash, target string) error {
	rc, err := files.Open(ctx, hash)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return err
	}
	u, err := tb.C.base.Parse(target)
	if err != nil {
		return fmt.Errorf("upload URL %q: %w", target, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u.String(), bytes.NewReader(b))
	if err != nil {
		return err
	}
	resp, err := tb.C.http.Do(req)
	if err != nil {
		return fmt.Errorf("upload files: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("upload files: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// follow polls the build's status every 200 ms (as E2B's SDK), passing
// new log entries on, until it is ready (nil) or failed (*build.StepError).
func (tb *TemplateBuilds) follow(ctx context.Context, tid, bid string) error {
	offset := 0
	for {
		var st struct {
			Status     string           `json:"status"`
			LogEntries []build.LogEntry `json:"logEntries"`
			Reason     *struct {
				Message string `json:"message"`
				Step    string `json:"step"`
			} `json:"reason"`
		}
		if _, err := tb.C.do(ctx, http.MethodGet, "/templates/"+tid+"/builds/"+bid+"/status?logsOffset="+strconv.Itoa(offset), nil, &st); err != nil {
			return fmt.Errorf("build status: %w", err)
		}
		offset += len(st.LogEntries)
		for _, e := range st.LogEntries {
			if tb.Log != nil {
				tb.Log(e)
			}
		}
		switch st.Status {
		case "ready":
			if len(st.LogEntries) == 0 {
				return nil
			}
			continue
		case "error":
			if len(st.LogEntries) > 0 {
				continue
			}
			if st.Reason == nil {
				return &build.StepError{Message: "the build failed"}
			}
			return &build.StepError{Step: st.Reason.Step, Message: st.Reason.Message}
		case "building", "waiting":
		default:
			return fmt.Errorf("build status %q", st.Status)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Export is a tar of path in a new sandbox of template (named by path's
// base name and below); the sandbox goes when it is closed.
func (tb *TemplateBuilds) Export(ctx context.Context, template, path string) (io.ReadCloser, error) {
	sb, err := tb.C.Create(ctx, CreateRequest{TemplateID: template, Timeout: new(int64(600))})
	if err != nil {
		return nil, err
	}
	kill := func() { _ = tb.C.Kill(context.WithoutCancel(ctx), sb.SandboxID) }
	conn, err := tb.C.Sandbox(ctx, sb.SandboxID)
	if err != nil {
		kill()
		return nil, err
	}
	res, err := conn.Exec(ctx, "mkdir -p /tmp/.cella-export && cp -a "+shellQuote(path)+" /tmp/.cella-export/", ExecOptions{User: "root"})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("export %s from %s: %s", path, template, strings.TrimSpace(res.Stderr))
	}
	var rc io.ReadCloser
	if err == nil {
		rc, err = conn.GetTar(ctx, "/tmp/.cella-export", "root")
	}
	if err != nil {
		kill()
		return nil, err
	}
	return &killOnClose{ReadCloser: rc, kill: kill}, nil
}

type killOnClose struct {
	io.ReadCloser
	kill func()
}

func (k *killOnClose) Close() error {
	err := k.ReadCloser.Close()
	k.kill()
	return err
}

// Remove deletes a template this client built (E2B's DELETE
// /templates/{templateID}).
func (tb *TemplateBuilds) Remove(ctx context.Context, name string) error {
	tb.mu.Lock()
	id := tb.ids[name]
	tb.mu.Unlock()
	if id == "" {
		id = name
	}
	_, err := tb.C.do(ctx, http.MethodDelete, "/templates/"+url.PathEscape(id), nil, nil)
	return err
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
