package sandbox

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/cella-sandbox/cella/internal/archive"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// Sandboxes that outlive their node (cella serve --archive). With an
// Archive configured, a pause (the API's, auto-pause's, lifecycle's) that
// leaves no frozen container ends by archiving the sandbox there instead
// of under <data>/archive: its writable layer and memory checkpoint go up
// as one sealed stream, then a manifest with everything another node needs
// to resume it (the record, the agent's config, the template's image, the
// agent binary's digest), and the local layer and checkpoint are dropped.
// A resume on this node pulls it back; a resume on a node that never had
// the sandbox imports it: reads the manifest, checks the caller owns it
// and that this node can restore it identically (runtime, agent binary,
// template image), claims it (Config.Claim: the cluster's record moves
// here) and then resumes as from a local archive. After a resume, and when
// the sandbox is killed, its objects are deleted.

// Archive is the object store paused sandboxes go to (internal/archive:
// sealed objects in an S3-compatible bucket).
type Archive interface {
	PutState(ctx context.Context, id string, write func(io.Writer) error) (archive.Digest, error)
	OpenState(ctx context.Context, id string, want archive.Digest, read func(io.Reader) error) error
	PutManifest(ctx context.Context, m archive.Manifest) error
	Manifest(ctx context.Context, id string) (archive.Manifest, error)
	Delete(ctx context.Context, id string) error
	PutAgent(ctx context.Context, digest string, r io.Reader) error
	GetAgent(ctx context.Context, digest string, w io.Writer) error
	String() string
}

// ErrMoved is what Config.Claim returns (wrapped) when another node holds
// the sandbox now: this node's copy of it is stale and is forgotten.
var ErrMoved = errors.New("the sandbox has moved to another node")

// templateImage names the image a template's name stands for: its manifest
// digest when pulled, else its cache key.
func templateImage(t *template.Template) string { return cmp.Or(t.Digest, t.Image) }

// archiveRemote uploads a paused sandbox's state and manifest; sb.opMu is
// held and nothing runs on its layer.
func (m *Manager) archiveRemote(ctx context.Context, sb *Sandbox, dirs [][2]string, mode string) error {
	agent, err := m.sandboxAgent(ctx, sb)
	if err != nil {
		return err
	}
	tpl, err := m.templateOf(ctx, sb.Dir, sb.TemplateID)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	sb.lc.remote = true // from the first byte up, a kill deletes what there is
	sb.mu.Unlock()
	if err := m.persist(ctx, sb); err != nil {
		return err
	}
	d, err := m.cfg.Archive.PutState(ctx, sb.ID, func(w io.Writer) error { return writeArchive(w, dirs) })
	if err != nil {
		return err
	}
	row, err := m.rowOf(sb)
	if err != nil {
		return err
	}
	man := archive.Manifest{SandboxID: sb.ID, Team: sb.Options.TeamID, KeyID: sb.Options.APIKeyID,
		Template: sb.TemplateID, TemplateDigest: templateImage(tpl), Runtime: sb.Runtime, PauseMode: mode,
		Agent: agent, State: d, Record: row.Record, StartedAt: row.StartedAt, EndAt: row.EndAt,
		Node: m.cfg.NodeName, ArchivedAt: time.Now().UTC()}
	if man.AgentConfig, err = os.ReadFile(filepath.Join(sb.Dir, savedConfigName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if man.Origin, err = os.ReadFile(filepath.Join(sb.Dir, originFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return m.cfg.Archive.PutManifest(ctx, man)
}

// sandboxAgent is the hash of the agent binary sb's memory holds
// (agents.go), which is in the archive store once it returns: uploaded
// once per binary and daemon process (agents/<sha256> is content-addressed
// and kept, so a sandbox carried here from another node finds its binary
// there already).
func (m *Manager) sandboxAgent(ctx context.Context, sb *Sandbox) (string, error) {
	hash := sb.agentHash()
	m.agentUpMu.Lock()
	defer m.agentUpMu.Unlock()
	if m.agentUp[hash] {
		return hash, nil
	}
	path, err := m.cfg.Agents.Path(hash)
	if err != nil {
		return "", fmt.Errorf("the agent binary of sandbox %s: %w", sb.ID, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if err := m.cfg.Archive.PutAgent(ctx, hash, f); err != nil {
		return "", fmt.Errorf("upload the agent binary: %w", err)
	}
	if m.agentUp == nil {
		m.agentUp = map[string]bool{}
	}
	m.agentUp[hash] = true
	return hash, nil
}

// carryAgent makes sb run the agent binary of hash, the one its memory
// image holds (a restore pages the agent's code in from the bound file:
// agents.go), pulling it from the archive store into this node's agent
// binaries when it has another build. Under agentsMu, with sb.agent set
// first: no prune removes it before the restore binds it.
func (m *Manager) carryAgent(ctx context.Context, sb *Sandbox, hash string) error {
	m.agentsMu.Lock()
	defer m.agentsMu.Unlock()
	sb.mu.Lock()
	sb.agent = hash
	sb.mu.Unlock()
	if _, err := m.cfg.Agents.Path(hash); err == nil {
		return nil
	}
	var bin bytes.Buffer
	if err := m.cfg.Archive.GetAgent(ctx, hash, &bin); err != nil {
		return fmt.Errorf("carry agent binary sha256:%s: %w", hash, err)
	}
	got, err := m.cfg.Agents.Add(bin.Bytes())
	if err != nil {
		return fmt.Errorf("carry agent binary sha256:%s: %w", hash, err)
	}
	if got != hash {
		return fmt.Errorf("carry agent binary sha256:%s: stored as %s", hash, got)
	}
	m.log.Info("agent binary carried from the archive", "id", sb.ID, "sha256", hash)
	return nil
}

// checkManifest refuses to restore what this node would not restore
// identically: another runtime, another image under the template's name.
// (Another agent binary is carried: carryAgent.)
func (m *Manager) checkManifest(ctx context.Context, man archive.Manifest) (*template.Template, error) {
	if man.Runtime != m.cfg.Runtime.Name() {
		return nil, errdefs.FailedPrecondition("sandbox %s was paused by runtime %s; this node runs %s", man.SandboxID, man.Runtime, m.cfg.Runtime.Name())
	}
	tpl, err := m.template(ctx, man.Template)
	if err != nil {
		return nil, err
	}
	if got := templateImage(tpl); got != man.TemplateDigest {
		return nil, errdefs.FailedPrecondition("sandbox %s runs on template %s image %s; this node's %s is image %s", man.SandboxID, man.Template, man.TemplateDigest, man.Template, got)
	}
	return tpl, nil
}

// claim takes the sandbox for this node (the cluster's record), if the
// daemon is in one.
func (m *Manager) claim(ctx context.Context, id string) error {
	if m.cfg.Claim == nil {
		return nil
	}
	return m.cfg.Claim(ctx, id)
}

// unarchiveRemote pulls an archived sandbox's layer and checkpoint back
// from the store into layer.Upper and ckpt; sb.opMu is held.
func (m *Manager) unarchiveRemote(ctx context.Context, sb *Sandbox, dests map[string]string) error {
	man, err := m.cfg.Archive.Manifest(ctx, sb.ID)
	if err != nil {
		return err
	}
	if man.Team != sb.Options.TeamID {
		return fmt.Errorf("%w: the manifest of %s names team %s, the sandbox is team %s's", archive.ErrCorrupt, sb.ID, man.Team, sb.Options.TeamID)
	}
	if _, err := m.checkManifest(ctx, man); err != nil {
		return err
	}
	if man.PauseMode == PauseCheckpoint { // a cold boot starts this node's agent
		if err := m.carryAgent(ctx, sb, man.Agent); err != nil {
			return err
		}
	}
	return m.cfg.Archive.OpenState(ctx, sb.ID, man.State, func(r io.Reader) error { return extractArchive(r, dests) })
}

// deleteRemote removes a sandbox's objects from the store, if it may have
// some. A kill of a sandbox that moved (its claim says so) leaves them to
// the node that holds it now.
func (m *Manager) deleteRemote(ctx context.Context, sb *Sandbox) {
	sb.mu.Lock()
	remote := sb.lc.remote
	sb.mu.Unlock()
	if !remote || m.cfg.Archive == nil {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := m.claim(dctx, sb.ID); err != nil {
		m.log.Warn("archived objects left to the node that holds the sandbox now", "id", sb.ID, "err", err)
		return
	}
	if err := m.cfg.Archive.Delete(dctx, sb.ID); err != nil {
		m.log.Error("delete archived objects", "id", sb.ID, "archive", m.cfg.Archive.String(), "err", err)
		return
	}
	sb.mu.Lock()
	sb.lc.remote = false
	sb.mu.Unlock()
}

// movedAway answers the kill of an archived paused copy another node
// claimed since (a resume there has it, or will): this copy is forgotten,
// not killed — the sandbox lives on there — and the caller is told to
// kill it again, which its record now routes to that node. sb.opMu is
// held.
func (m *Manager) movedAway(ctx context.Context, sb *Sandbox) error {
	sb.mu.Lock()
	archived := sb.state == StatePaused && sb.lc.archived && sb.lc.remote
	sb.mu.Unlock()
	if !archived || m.cfg.Archive == nil {
		return nil
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	err := m.claim(cctx, sb.ID)
	if !errors.Is(err, ErrMoved) {
		return nil // this node's: the kill goes on (deleteRemote claims again)
	}
	m.forgetLocked(ctx, sb)
	return errdefs.Conflict("sandbox %s moved to another node while this kill came here (%v): kill it again, its record routes the kill there now", sb.ID, err)
}

// importArchived makes a sandbox this node never had (or forgot) from its
// archive, paused and archived, for a resume: p must own it (anything else
// is the not-found of an unknown sandbox), this node must be able to
// restore it, and it must be this node's to take (claim).
func (m *Manager) importArchived(ctx context.Context, p tenant.Principal, id string) (*Sandbox, error) {
	man, err := m.archivedFor(ctx, p, id)
	if err != nil {
		return nil, err
	}
	var rec record
	if err := json.Unmarshal(man.Record, &rec); err != nil {
		m.log.Warn("archived sandbox refused: unreadable record", "id", id, "err", err)
		return nil, notFound(id)
	}
	if rec.Options.TeamID != man.Team || rec.Options.APIKeyID != man.KeyID {
		m.log.Warn("archived sandbox refused: its record and manifest name different owners", "id", id)
		return nil, notFound(id)
	}
	if len(rec.Options.Volumes) > 0 {
		return nil, errdefs.FailedPrecondition("sandbox %s mounts volumes, which stay on node %s: it resumes only there", id, man.Node)
	}
	tpl, err := m.checkManifest(ctx, man)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(sandboxesDir(m.cfg.DataDir), id)
	sb := &Sandbox{
		ID: id, TemplateID: man.Template, Runtime: man.Runtime, Options: rec.Options,
		StartedAt: man.StartedAt.UTC(), EnvdAccessToken: rec.EnvdAccessToken, channelTokens: rec.tokens(),
		Dir: dir, state: StatePaused, endAt: man.EndAt.UTC(), pauseMode: man.PauseMode, agent: m.agentOf(rec.Agent),
	}
	rec.Archived, rec.Remote = true, true
	sb.restoreLifecycle(rec) // lifecycle.go
	sb.lc.archivePath = m.cfg.Archive.String() + "/sandboxes/" + id
	// Tracked before it is claimed: from the claim on, the cluster's record
	// names this node, and a sync that found no such sandbox here would
	// delete the record (and the old node record its stale copy again).
	// Not remote until claimed: the objects are not this node's yet (a
	// kill leaves them, Archived does not list it for forgetMoved).
	// Under its opMu until made: a concurrent resume or kill of it waits.
	sb.lc.remote = false
	sb.opMu.Lock()
	m.mu.Lock()
	if have, ok := m.sandboxes[id]; ok { // a concurrent import won
		m.mu.Unlock()
		sb.opMu.Unlock()
		return have, nil
	}
	m.sandboxes[id] = sb
	m.mu.Unlock()
	defer sb.opMu.Unlock()
	untrack := func() {
		m.mu.Lock()
		if m.sandboxes[id] == sb {
			delete(m.sandboxes, id)
		}
		m.mu.Unlock()
	}
	if err := m.claim(ctx, id); err != nil {
		untrack()
		return nil, fmt.Errorf("take sandbox %s for this node: %w", id, err)
	}
	sb.mu.Lock()
	sb.lc.remote = true
	sb.mu.Unlock()
	fail := func(err error) (*Sandbox, error) {
		untrack()
		_ = os.RemoveAll(dir)
		m.releaseTemplate(dir)
		return nil, fmt.Errorf("import sandbox %s: %w", id, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fail(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "bundle"), 0o700); err != nil {
		return fail(err)
	}
	if _, err := m.cfg.Templates.Acquire(dir, tpl); err != nil {
		return fail(err)
	}
	for name, b := range map[string][]byte{savedConfigName: man.AgentConfig, originFile: man.Origin} {
		if len(b) == 0 {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return fail(err)
		}
	}
	if err := m.persistNew(ctx, sb); err != nil {
		return fail(err)
	}
	m.log.Info("sandbox imported from the archive", "id", id, "from_node", man.Node, "archived_at", man.ArchivedAt)
	return sb, nil
}

// archivedFor reads sandbox id's manifest for p: a missing, unreadable or
// foreign one is the not-found of an unknown sandbox (the reason logged).
func (m *Manager) archivedFor(ctx context.Context, p tenant.Principal, id string) (archive.Manifest, error) {
	man, err := m.cfg.Archive.Manifest(ctx, id)
	if err != nil {
		if !errdefs.Is(err, errdefs.KindNotFound) {
			m.log.Warn("archived sandbox refused", "id", id, "err", err)
		}
		return man, notFound(id)
	}
	if !p.Can(tenant.Owner{Team: man.Team, Key: man.KeyID}) {
		return man, notFound(id)
	}
	return man, nil
}

// killArchived kills a sandbox this node does not have but the archive
// does (its node is gone): the caller's team's only, taken for this node
// (so a node that comes back forgets it, and the record goes with this
// node's next sync), its objects deleted.
func (m *Manager) killArchived(ctx context.Context, p tenant.Principal, id string) error {
	man, err := m.archivedFor(ctx, p, id)
	if err != nil {
		return err
	}
	if err := m.claim(ctx, id); err != nil {
		return fmt.Errorf("take sandbox %s for this node: %w", id, err)
	}
	if err := m.cfg.Archive.Delete(ctx, id); err != nil {
		return fmt.Errorf("kill archived sandbox %s: %w", id, err)
	}
	m.log.Info("archived sandbox killed", "id", id, "from_node", man.Node)
	m.lifecycleEvent(id, "killed (archived on node %s)", man.Node)
	return nil
}

// Forget drops this node's copy of a paused, archived sandbox that another
// node holds now (ErrMoved): its record, directory and lease go; its
// archived objects are the other node's and stay.
func (m *Manager) Forget(ctx context.Context, id string) error {
	sb, unlock, err := m.opLocked(id)
	if err != nil {
		return err
	}
	defer unlock()
	sb.mu.Lock()
	state, archived := sb.state, sb.lc.archived
	sb.mu.Unlock()
	if state != StatePaused || !archived {
		return errdefs.Conflict("sandbox %s is %s (archived: %v): only an archived paused sandbox can be forgotten", id, state, archived)
	}
	m.forgetLocked(ctx, sb)
	return nil
}

// forgetLocked is Forget's work; sb.opMu is held.
func (m *Manager) forgetLocked(ctx context.Context, sb *Sandbox) {
	m.mu.Lock()
	delete(m.sandboxes, sb.ID)
	m.mu.Unlock()
	sb.mu.Lock()
	sb.lc.remote = false // the objects are the new holder's
	sb.mu.Unlock()
	m.cleanup(ctx, sb)
	m.log.Info("sandbox forgotten: another node holds it now", "id", sb.ID)
	go m.pruneAgents(context.WithoutCancel(ctx)) // agents.go: its agent binary may be unused now
}

// ArchiveGone says whether the objects of sandbox id are gone from the
// archive store: an archived copy of it can never resume (the node that
// took it deleted them when it ran or killed it).
func (m *Manager) ArchiveGone(ctx context.Context, id string) (bool, error) {
	if m.cfg.Archive == nil {
		return false, nil
	}
	_, err := m.cfg.Archive.Manifest(ctx, id)
	if errdefs.Is(err, errdefs.KindNotFound) {
		return true, nil
	}
	return false, err
}

// Archived lists the IDs of this node's paused sandboxes whose state is in
// the archive store (what another node may have taken).
func (m *Manager) Archived() []string {
	var ids []string
	for _, sb := range m.List(tenant.System) {
		sb.mu.Lock()
		if sb.state == StatePaused && sb.lc.archived && sb.lc.remote {
			ids = append(ids, sb.ID)
		}
		sb.mu.Unlock()
	}
	return ids
}
