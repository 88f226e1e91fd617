package dockerfile

import (
	"context"
	"io"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// EngineRunner runs a plan on a daemon's own engine, as p.
type EngineRunner struct {
	Engine    *build.Engine
	Templates *template.Store
	P         tenant.Principal
	Log       func(build.LogEntry)
}

// Build implements Runner.
func (r EngineRunner) Build(ctx context.Context, spec build.Spec, files build.Files) error {
	_, err := r.Engine.Build(ctx, r.P, spec, files, r.Log)
	return err
}

// Export implements Runner.
func (r EngineRunner) Export(ctx context.Context, tpl, path string) (io.ReadCloser, error) {
	return r.Engine.Export(ctx, tpl, path)
}

// Remove implements Runner.
func (r EngineRunner) Remove(_ context.Context, tpl string) error { return r.Templates.Delete(tpl) }
