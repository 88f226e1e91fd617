package build

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// Export returns a tar of path in a sandbox of template (a build sandbox,
// the builder's), its entries named by path's base name and below: what a
// Dockerfile's COPY --from an earlier stage copies. Closing it removes the
// sandbox.
func (e *Engine) Export(ctx context.Context, templateName, path string) (io.ReadCloser, error) {
	t, err := e.cfg.Templates.Get(templateName)
	if err != nil {
		return nil, err
	}
	// No egress: the sandbox only copies files.
	r := &run{e: e, p: tenant.Principal{Ceiling: &egress.Policy{}}, spec: Spec{Name: templateName}, log: func(LogEntry) {}}
	b, err := r.boot(ctx, &template.Template{Image: t.Image})
	if err != nil {
		return nil, err
	}
	const dir = "/tmp/.cella-export"
	res, err := b.root(ctx, `mkdir -p "$2" && cp -a "$1" "$2/"`, path, dir)
	if err == nil && res.code != 0 {
		err = fmt.Errorf("export %s from %s: %s", path, templateName, strings.TrimSpace(res.output))
	}
	var resp *http.Response
	if err == nil {
		var req *http.Request
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, b.sb.Agent().URL(agentapi.TarPath, url.Values{"path": {dir}, "username": {"root"}}), nil)
		if err == nil {
			resp, err = b.sb.Agent().HTTP("root").Do(req)
		}
		if err == nil && resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			err = fmt.Errorf("export %s from %s: %s", path, templateName, strings.TrimSpace(string(body)))
		}
	}
	if err != nil {
		b.kill()
		return nil, err
	}
	return &exported{ReadCloser: resp.Body, b: b}, nil
}

type exported struct {
	io.ReadCloser
	b *box
}

func (x *exported) Close() error {
	err := x.ReadCloser.Close()
	x.b.kill()
	return err
}
