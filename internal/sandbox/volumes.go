package sandbox

import (
	"context"
	"path"
	"strings"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/volume"
)

// VolumeMount mounts a named volume into a sandbox (E2B's volumeMounts item
// plus cella's readOnly).
type VolumeMount struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// forbiddenMountRoots are guest paths a volume may not cover: the kernel's
// views, the agent's run dir and binary.
var forbiddenMountRoots = []string{"/proc", "/sys", "/dev", "/run/cella", "/.cella"}

// ValidateVolumeMounts checks names and guest paths: a path is absolute,
// clean, not "/", not at or under /proc, /sys, /dev, /run/cella or /.cella,
// and used once.
func ValidateVolumeMounts(vms []VolumeMount) error {
	seen := map[string]bool{}
	for _, vm := range vms {
		if err := volume.ValidateName(vm.Name); err != nil {
			return err
		}
		p := vm.Path
		if p == "" || !strings.HasPrefix(p, "/") {
			return errdefs.InvalidArgument("volume %q: mount path %q must be an absolute path", vm.Name, p)
		}
		if path.Clean(p) != p || strings.ContainsAny(p, "\x00,:\n") {
			return errdefs.InvalidArgument("volume %q: mount path %q must be a clean path (no '..', '//', trailing '/', ',' or ':')", vm.Name, p)
		}
		if p == "/" {
			return errdefs.InvalidArgument("volume %q: mount path must not be /", vm.Name)
		}
		for _, f := range forbiddenMountRoots {
			if p == f || strings.HasPrefix(p, f+"/") {
				return errdefs.InvalidArgument("volume %q: mount path %q is under %s, which cella reserves", vm.Name, p, f)
			}
		}
		if seen[p] {
			return errdefs.InvalidArgument("mount path %q is used twice", p)
		}
		seen[p] = true
	}
	return nil
}

// holdVolumes validates a create's volume mounts and keeps their volumes
// from being deleted until release (after the sandbox is registered).
func (m *Manager) holdVolumes(ctx context.Context, o *Options) (release func(), err error) {
	if len(o.Volumes) == 0 {
		return func() {}, nil
	}
	if err := ValidateVolumeMounts(o.Volumes); err != nil {
		return nil, err
	}
	if m.cfg.Volumes == nil {
		return nil, errdefs.NotImplemented("this daemon has no volume store")
	}
	names := make([]string, 0, len(o.Volumes))
	for _, vm := range o.Volumes {
		names = append(names, vm.Name)
	}
	return m.cfg.Volumes.Hold(ctx, names)
}

// volumeMounts are the bind mounts of a sandbox's volumes.
func (m *Manager) volumeMounts(sb *Sandbox) []runtime.Mount {
	if len(sb.Options.Volumes) == 0 || m.cfg.Volumes == nil {
		return nil
	}
	out := make([]runtime.Mount, 0, len(sb.Options.Volumes))
	for _, vm := range sb.Options.Volumes {
		out = append(out, runtime.Mount{Source: m.cfg.Volumes.HostPath(vm.Name), Destination: vm.Path, ReadOnly: vm.ReadOnly})
	}
	return out
}

// VolumeUsers returns the IDs of the live (running or paused) sandboxes that
// mount the named volume.
func (m *Manager) VolumeUsers(name string) []string {
	var ids []string
	for _, sb := range m.List() {
		if sb.State() == StateDead {
			continue
		}
		for _, vm := range sb.Options.Volumes {
			if vm.Name == name {
				ids = append(ids, sb.ID)
				break
			}
		}
	}
	return ids
}
