package daemon

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/metrics"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// newMetrics makes the daemon's instruments, with series for the templates
// that exist now.
func newMetrics(runtimeName string, tpls *template.Store) *metrics.Metrics {
	var names []string
	if list, err := tpls.List(); err == nil {
		for _, t := range list {
			names = append(names, t.Name)
		}
	}
	return metrics.New(runtimeName, names)
}

// keyLimits is the sandbox manager's view of the keys' quotas: the admin
// key, and a key deleted since it made its sandboxes, are unlimited.
func keyLimits(st interface {
	GetAPIKey(ctx context.Context, id string) (store.APIKey, error)
}) func(context.Context, string) (sandbox.KeyQuota, error) {
	return func(ctx context.Context, id string) (sandbox.KeyQuota, error) {
		if id == store.AdminKeyID {
			return sandbox.KeyQuota{}, nil
		}
		k, err := st.GetAPIKey(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return sandbox.KeyQuota{}, nil
		}
		if err != nil {
			return sandbox.KeyQuota{}, err
		}
		return sandbox.KeyQuota{Name: k.Name, Limits: k.Limits}, nil
	}
}

// openAccessLog opens the access log (--access-log): "-" is stderr, any
// other value a file appended to (made 0600: it names keys and sandboxes).
// "" is none. The file is opened O_APPEND, so logrotate's copytruncate
// works.
func openAccessLog(path string) (*slog.Logger, func() error, error) {
	switch path {
	case "":
		return nil, func() error { return nil }, nil
	case "-":
		return slog.New(slog.NewJSONHandler(os.Stderr, nil)), func() error { return nil }, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fieldErr("access-log", "%v", err)
	}
	return slog.New(slog.NewJSONHandler(f, nil)), f.Close, nil
}

// ObservedBuilder is how template builds reach the metrics: the daemon wraps
// its build.Builder with it, and every successful Build is observed in
// cella_template_build_duration_seconds under its Spec.Name.
func ObservedBuilder(b build.Builder, m *metrics.Metrics) build.Builder {
	return observedBuilder{b, m}
}

type observedBuilder struct {
	build.Builder
	m *metrics.Metrics
}

func (o observedBuilder) Build(ctx context.Context, p tenant.Principal, spec build.Spec, files build.Files, log func(build.LogEntry)) (build.Result, error) {
	start := time.Now()
	res, err := o.Builder.Build(ctx, p, spec, files, log)
	if err != nil {
		return res, err
	}
	o.m.TemplateBuild(spec.Name, time.Since(start))
	return res, nil
}
