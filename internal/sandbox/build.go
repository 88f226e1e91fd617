package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/layerstore"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// What the manager offers template builds (internal/build): sandboxes on
// an unnamed image of the template store (Options.Image), the capture of a
// sandbox's writable layer as an OCI layer, and memory snapshots that
// sandboxes of a template start from.

// templateFor is the template a create starts on: the image the build
// engine names (Options.Image, never set from a request), else the name.
func (m *Manager) templateFor(ctx context.Context, opts Options) (*template.Template, error) {
	if opts.Image == "" {
		return m.template(ctx, opts.TemplateID)
	}
	t, err := m.cfg.Templates.Image(opts.Image)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", opts.Image, err)
	}
	t.Name, t.Services = opts.TemplateID, opts.Services
	return t, nil
}

// CaptureLayer freezes sandbox id and calls fn with a function that writes
// everything the sandbox wrote — its overlay upper — as an OCI layer tar
// (whiteouts and opaque dirs in OCI form), leaving out what cella itself
// put there (the resolver, the hosts file it adds, the egress CA, cella's append to the trust
// store), then thaws it. writeTar may be called more than once (a first
// pass for the diffID, a second into the layer store) and gives the same
// bytes each time.
func (m *Manager) CaptureLayer(ctx context.Context, p tenant.Principal, id string, fn func(writeTar func(io.Writer) error) error) error {
	sb, err := m.Lookup(p, id)
	if err != nil {
		return err
	}
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	if sb.State() != StateRunning || sb.layer == nil {
		return errdefs.Conflict("sandbox %q is %s: %s", id, sb.State(), sb.Err())
	}
	rt := m.cfg.Runtime
	if err := rt.Freeze(ctx, sb.ID); err != nil {
		return fmt.Errorf("capture layer of %s: freeze: %w", id, err)
	}
	upper := sb.layer.Upper
	skip := m.ownFiles(upper)
	ferr := fn(func(w io.Writer) error { return layerstore.WriteTarSkipping(w, upper, skip) })
	if err := rt.Thaw(context.WithoutCancel(ctx), sb.ID); err != nil {
		return errors.Join(fmt.Errorf("capture layer of %s: thaw: %w", id, err), ferr)
	}
	return ferr
}

// ownFiles says which paths of a sandbox's upper cella wrote for the
// sandbox's own run (prepareGuestNetwork, prepareGuestHosts), not the sandbox: they must not
// become part of a template.
func (m *Manager) ownFiles(upper string) func(rel string) bool {
	bundle := strings.TrimPrefix(guestBundlePath, "/")
	ownBundle := false
	hosts := ownHosts(upper) // hosts.go
	if n := m.cfg.Network; n != nil && len(n.CAPEM) > 0 {
		if b, err := os.ReadFile(filepath.Join(upper, bundle)); err == nil {
			// Still cella's append to the template's bundle: a step that
			// rebuilt the bundle (update-ca-certificates) wrote its own.
			ownBundle = bytes.HasSuffix(b, n.CAPEM)
		}
	}
	return func(rel string) bool {
		switch rel {
		case "etc/resolv.conf", strings.TrimPrefix(filepath.Dir(guestCAPath), "/"):
			return true
		case bundle:
			return ownBundle
		case "etc/hosts":
			return hosts
		}
		return false
	}
}

// TemplateSnapshot takes the memory snapshot (with its files) of build
// sandbox id that sandboxes of template tmpl start from: hidden (no team
// can list, use or delete it by ID; only a template names it) and owned by
// the system. It returns the snapshot's ID. Until TemplateNamed(ID) it is
// pending: once not pending, it is removed as soon as tmpl names another
// snapshot or none (pruneTemplateSnapshots).
func (m *Manager) TemplateSnapshot(ctx context.Context, id, tmpl string) (string, error) {
	if !m.memorySnapshots() {
		return "", errdefs.Unavailable("runtime %s has no memory snapshots: a start command cannot be captured running", m.cfg.Runtime.Name())
	}
	m.pruneTemplateSnapshots(ctx)
	// Pending from before its row exists to after its template names it.
	m.snapsMu.Lock()
	if m.pendingSnaps == nil {
		m.pendingSnaps = map[string]bool{}
	}
	m.pendingSnaps["sandbox:"+id] = true
	m.snapsMu.Unlock()
	info, err := m.snapshot(ctx, tenant.System, id, "", true, tmpl)
	m.snapsMu.Lock()
	delete(m.pendingSnaps, "sandbox:"+id)
	if err == nil {
		m.pendingSnaps[info.ID] = true
	}
	m.snapsMu.Unlock()
	if err != nil {
		return "", err
	}
	return info.ID, nil
}

// TemplateNamed says that template snapshot snap is named by its template
// now (or will never be: DeleteTemplateSnapshot).
func (m *Manager) TemplateNamed(snap string) {
	m.snapsMu.Lock()
	delete(m.pendingSnaps, snap)
	m.snapsMu.Unlock()
}

// DeleteTemplateSnapshot removes a template's snapshot (the template was
// rebuilt or its build failed); sandboxes made from it keep running.
func (m *Manager) DeleteTemplateSnapshot(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	m.TemplateNamed(id)
	if err := m.cfg.Store.DeleteSnapshot(ctx, id); err != nil {
		return err
	}
	m.gcSnapshots(ctx)
	return nil
}

// pruneTemplateSnapshots removes the template snapshots whose template
// names another snapshot or is gone (rebuilt elsewhere, `cella template
// rm`), except those of builds in progress: their memory images are large.
func (m *Manager) pruneTemplateSnapshots(ctx context.Context) {
	rows, err := m.cfg.Store.ListSnapshots(ctx, store.SnapshotFilter{IncludeHidden: true})
	if err != nil {
		m.log.Warn("prune template snapshots", "err", err)
		return
	}
	pruned := false
	for _, row := range rows {
		var rec snapshotRecord
		if !row.Hidden || json.Unmarshal(row.Record, &rec) != nil || rec.Template == "" {
			continue
		}
		m.snapsMu.Lock()
		pending := m.pendingSnaps[row.ID] || m.pendingSnaps["sandbox:"+row.SandboxID]
		m.snapsMu.Unlock()
		if pending {
			continue
		}
		t, err := m.cfg.Templates.Get(rec.Template)
		if err == nil && t.Snapshot == row.ID || err != nil && !errors.Is(err, template.ErrNotFound) {
			continue
		}
		if err := m.cfg.Store.DeleteSnapshot(ctx, row.ID); err != nil {
			m.log.Warn("prune template snapshot", "snapshot", row.ID, "err", err)
			continue
		}
		m.log.Info("template snapshot removed: its template no longer names it", "snapshot", row.ID, "template", rec.Template)
		pruned = true
	}
	if pruned {
		m.gcSnapshots(ctx)
	}
}

// fromTemplateSnapshot is Create for a template whose build captured its
// start command running: the sandbox is restored from that snapshot. It
// belongs to p and gets p's request (egress within p's ceiling, env vars,
// metadata, timeout, lifecycle, volumes); the template's resources, which
// the memory image was made with, stay. ok is false when this daemon does
// not hold the snapshot (a template built by another daemon sharing the
// cache): the create then boots cold.
func (m *Manager) fromTemplateSnapshot(ctx context.Context, p tenant.Principal, req Options, tpl *template.Template) (_ *Sandbox, ok bool, _ error) {
	row, err := m.cfg.Store.GetSnapshot(ctx, "", tpl.Snapshot)
	if err != nil || row.ID != tpl.Snapshot || !row.Hidden {
		return nil, false, nil
	}
	var rec snapshotRecord
	if err := json.Unmarshal(row.Record, &rec); err != nil || !rec.Memory || rec.Runtime != m.cfg.Runtime.Name() {
		return nil, false, nil
	}
	opts := req
	opts.CPUs, opts.MemoryMB, opts.Pids = rec.Options.CPUs, rec.Options.MemoryMB, rec.Options.Pids
	opts.Image = ""
	res, err := m.reserve(ctx, opts, 1) // quota.go: the sizes it runs with
	if err != nil {
		return nil, true, err
	}
	defer res.release()
	sb, err := m.fromSnapshot(withReservation(ctx, res), p, opts, row, rec, false)
	return sb, true, err
}
