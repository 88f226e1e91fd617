package daemon

import (
	"context"
	"errors"
	"testing"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/metrics"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// builderFunc is a build.Builder from a function: the template-build engine
// is another package's; what is under test here is the wrapper.
type builderFunc func(spec build.Spec) (build.Result, error)

func (f builderFunc) Build(_ context.Context, _ tenant.Principal, spec build.Spec, _ build.Files, _ func(build.LogEntry)) (build.Result, error) {
	return f(spec)
}

// TestObservedBuilder: a successful build is one observation under its
// template; a failed one none; results and errors pass through unchanged.
func TestObservedBuilder(t *testing.T) {
	m := metrics.New("gvisor", nil)
	fail := errors.New("step 2: failed to run command 'false': exit status 1")
	b := ObservedBuilder(builderFunc(func(spec build.Spec) (build.Result, error) {
		if spec.Name == "bad" {
			return build.Result{}, fail
		}
		return build.Result{Template: spec.Name, Digest: "sha256:x"}, nil
	}), m)
	for _, name := range []string{"py", "py", "bad", "node"} {
		res, err := b.Build(context.Background(), tenant.System, build.Spec{Name: name}, nil, nil)
		if name == "bad" {
			if !errors.Is(err, fail) {
				t.Fatalf("the build's error did not pass through: %v", err)
			}
			continue
		}
		if err != nil || res.Template != name || res.Digest != "sha256:x" {
			t.Fatalf("build %s: %+v %v", name, res, err)
		}
	}
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, f := range fams {
		if f.GetName() != metrics.NameBuild {
			continue
		}
		for _, s := range f.GetMetric() {
			var tpl, rt string
			for _, l := range s.GetLabel() {
				switch l.GetName() {
				case "template":
					tpl = l.GetValue()
				case "runtime":
					rt = l.GetValue()
				}
			}
			if rt != "gvisor" || s.GetHistogram() == nil {
				t.Fatalf("series %v", s)
			}
			got[tpl] = s.GetHistogram().GetSampleCount()
		}
	}
	if len(got) != 2 || got["py"] != 2 || got["node"] != 1 {
		t.Fatalf("build observations by template: %v", got)
	}
}
