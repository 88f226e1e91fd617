package sandbox

import (
	"context"
	"path"
	"strings"

	"github.com/cella-sandbox/cella/internal/tenant"

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
	// ID is the volume the name meant for the sandbox's owner when it was
	// created (records from before volume IDs have the name as ID).
	ID string `json:"id,omitempty"`
}

// volumeID is the ID of the mounted volume.
func (vm VolumeMount) volumeID() string {
	if vm.ID != "" {
		return vm.ID
	}
	return vm.Name
}

// forbiddenMountRoots are guest paths a volume may not cover: the kernel's
// views, the agent's run dir and binary.
var forbiddenMountRoots = []string{"/proc", "/sys", "/dev", "/run/cella", "/.cella"}

// ValidateVolumeMounts checks names and guest paths: a path is absolute,
// clean, not "/", not at, under or above /proc, /sys, /dev, /run/cella or
// /.cella (a volume at /run would cover the agent's run dir, mounted
// before it), and used once.
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
			if strings.HasPrefix(f, p+"/") {
				return errdefs.InvalidArgument("volume %q: mount path %q would cover %s, which cella reserves", vm.Name, p, f)
			}
		}
		if seen[p] {
			return errdefs.InvalidArgument("mount path %q is used twice", p)
		}
		seen[p] = true
	}
	return nil
}

// holdVolumes validates a create's volume mounts, resolves each name among
// the volumes p may use (recording its ID), and keeps those volumes from
// being deleted until release (after the sandbox is registered).
func (m *Manager) holdVolumes(ctx context.Context, p tenant.Principal, o *Options) (release func(), err error) {
	if len(o.Volumes) == 0 {
		return func() {}, nil
	}
	if err := ValidateVolumeMounts(o.Volumes); err != nil {
		return nil, err
	}
	if m.cfg.Volumes == nil {
		return nil, errdefs.NotImplemented("this daemon has no volume store")
	}
	refs := make([]string, 0, len(o.Volumes))
	for _, vm := range o.Volumes {
		ref := vm.Name
		if vm.ID != "" { // a fork's or a snapshot's: the original's volume
			ref = vm.ID
		}
		refs = append(refs, ref)
	}
	ids, release, err := m.cfg.Volumes.Hold(ctx, p, refs)
	if err != nil {
		return nil, err
	}
	for i := range o.Volumes {
		o.Volumes[i].ID = ids[i]
	}
	return release, nil
}

// volumeMounts are the bind mounts of a sandbox's volumes.
func (m *Manager) volumeMounts(sb *Sandbox) []runtime.Mount {
	if len(sb.Options.Volumes) == 0 || m.cfg.Volumes == nil {
		return nil
	}
	out := make([]runtime.Mount, 0, len(sb.Options.Volumes))
	for _, vm := range sb.Options.Volumes {
		out = append(out, runtime.Mount{Source: m.cfg.Volumes.HostPath(vm.volumeID()), Destination: vm.Path, ReadOnly: vm.ReadOnly})
	}
	return out
}

// VolumeUsers returns the IDs of the live (running or paused) sandboxes that
// mount the volume with this ID.
func (m *Manager) VolumeUsers(id string) []string {
	var ids []string
	for _, sb := range m.List(tenant.System) {
		if sb.State() == StateDead {
			continue
		}
		for _, vm := range sb.Options.Volumes {
			if vm.volumeID() == id {
				ids = append(ids, sb.ID)
				break
			}
		}
	}
	return ids
}
