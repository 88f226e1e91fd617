package sandbox

import (
	"slices"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/template"
)

// Sandboxes of a template whose services name Docker (the docker builtin
// and templates built on it; snapshots and forks lease it with its
// services) run a container engine inside: their
// container is started with runtime.Spec.ContainerEngine, which only
// gVisor grants (its sentry serves the mounts, namespaces and bridges).

// runsEngine says whether sandboxes of tpl run a container engine.
func runsEngine(tpl *template.Template) bool {
	return slices.Contains(tpl.Services, template.ServiceDocker)
}

// checkEngine refuses a template that runs a container engine on a
// runtime that would have to give it the host kernel's mounts and
// namespaces: before anything of the sandbox is made, naming what to do.
func (m *Manager) checkEngine(tpl *template.Template) error {
	if !runsEngine(tpl) || m.cfg.Runtime.Name() == runtime.GVisor {
		return nil
	}
	return errdefs.FailedPrecondition("template %q runs Docker inside its sandboxes, which needs the gvisor runtime: this daemon runs %s, whose sandboxes share the host kernel, and an engine would need its mounts, namespaces and bridges (start cella serve --runtime gvisor)",
		tpl.Name, m.cfg.Runtime.Name())
}

// engineOf says whether sandbox sb's container runs a container engine:
// what the template it leased says, the same for its first start, a
// resume, a fork and a restore after a daemon restart.
func (m *Manager) engineOf(sb *Sandbox) bool {
	t, err := m.cfg.Templates.Leased(sb.Dir)
	return err == nil && runsEngine(t)
}
