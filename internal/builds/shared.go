package builds

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// On a cluster node the API templates are the cluster's (Config.Shared):
// each has a record every node reads (the daemon's, in the Kubernetes API)
// with its team, alias, the node that builds it and, once built, the OCI
// reference and digest of its current build. The node that builds a
// template pushes each finished build and records it before the build is
// ready; a create of a template this node lacks pulls the record's build
// and imports it here under the same template ID, alias and build ID; a
// template whose record is gone is dropped here on its next use.

// Shared is the cluster's side of API templates.
type Shared interface {
	// Lookup is the record of the template ref names (its ID, else the
	// alias within the caller's team); NotFound for an unknown one and a
	// foreign one alike.
	Lookup(ctx context.Context, c Caller, id, alias string) (SharedTemplate, error)
	// ReserveAlias takes alias for team's template id, atomically
	// cluster-wide: the template ID the alias is team's by (id, or the one
	// another request of team reserved it for first), or a conflict when
	// another team holds it.
	ReserveAlias(ctx context.Context, alias, team, id string) (string, error)
	// Building records that this node builds b of t (gateways pin the
	// build's calls here), its alias reserved for t.
	Building(ctx context.Context, t store.APITemplate, b store.Build) error
	// Publish pushes the finished build b of t to the cluster's registry
	// and records it under its tags, and as the current build if current
	// (what the template's name alone resolves to here once b is ready);
	// its failure fails the build.
	Publish(ctx context.Context, t store.APITemplate, b store.Build, current bool, log func(string)) error
	// Fetch pulls st's build into the template store as name, its digest
	// checked. Concurrent fetches of one build pull once.
	Fetch(ctx context.Context, st SharedTemplate, name string) error
	// Published records that template id is public (or no longer is):
	// any team may create from it, on any node.
	Published(ctx context.Context, id string, public bool) error
	// AssignTags points tags of template id at the build its tag from
	// names in the record and returns that build's ID; NotFound if from
	// names none there.
	AssignTags(ctx context.Context, id, from string, tags []string) (string, error)
	// RemoveTags drops tags (never "default") of template id from its
	// record; one that is not there is no error.
	RemoveTags(ctx context.Context, id string, tags []string) error
	// Deleted removes the record of template id (gone already: nil).
	Deleted(ctx context.Context, id string) error
}

// SharedTemplate is what the cluster records of an API template: its
// current build (the default tag's) and the builds of its other tags.
type SharedTemplate struct {
	ID, Team, Alias string
	// Public: any team may use it (E2B's publish).
	Public bool
	SharedBuild
	Tags map[string]SharedBuild
}

// SharedBuild is one pushed build of a shared template.
type SharedBuild struct {
	// Build is the build ID of Reference/Digest ("": not built yet),
	// requested with CPUCount and MemoryMB (0: E2B's defaults).
	Build, Reference, Digest string
	CPUCount, MemoryMB       int
	// Services are the template-store services of the build's name
	// (its start and ready commands travel in the image's config).
	Services []string
}

// tag is the build the record's tag names ("": the current build).
func (st SharedTemplate) tag(tag string) (SharedBuild, bool) {
	if tag == "" || tag == DefaultTag {
		return st.SharedBuild, true
	}
	b, ok := st.Tags[tag]
	return b, ok
}

// sharedAlias is the template ID the cluster knows the caller's alias by,
// reserved for the caller's team: the one its records name, else newID.
// An alias of another team is a conflict. The records are read first (an
// alias recorded before reservations existed has none), but only the
// reservation decides: two teams asking for one new alias on two nodes
// at once both find no record, and one of them gets the conflict here.
func (s *Service) sharedAlias(ctx context.Context, c Caller, alias, newID string) (string, error) {
	if s.cfg.Shared == nil {
		return newID, nil
	}
	id, team := newID, c.P.Team
	st, err := s.cfg.Shared.Lookup(ctx, Caller{P: tenant.System}, "", alias)
	switch {
	case errdefs.Is(err, errdefs.KindNotFound):
	case err != nil:
		return "", err
	case !c.P.Can(tenant.Owner{Team: st.Team}):
		return "", errdefs.Conflict("Alias '%s' is already used by another team", alias)
	default:
		id, team = st.ID, st.Team // the admin's rebuild of a team's template stays the team's
	}
	return s.cfg.Shared.ReserveAlias(ctx, alias, team, id)
}

// resolveShared is Resolve on a cluster node for a ref that may name an
// API template: handled=false leaves ref to the local resolution
// (builtins, this machine's templates).
func (s *Service) resolveShared(ctx context.Context, c Caller, ref string) (name string, handled bool, err error) {
	n, perr := ParseName(ref)
	alias := n.Alias
	switch {
	case perr != nil:
		alias = ""
	case n.Namespace != "":
		alias = n.Namespace + "/" + n.Alias // E2B scopes a name by its team
	}
	st, err := s.cfg.Shared.Lookup(ctx, c, ref, alias)
	if err == nil && !c.P.Can(tenant.Owner{Team: st.Team}) {
		// Another team's published record: a template of the caller's own
		// of that name on this node (one made before it joined the
		// cluster, which has no record) is what the caller means.
		if t, _, ferr := s.findTemplate(ctx, c, ref, true); ferr == nil && !t.Shared {
			return ref, false, nil
		}
	}
	if errdefs.Is(err, errdefs.KindNotFound) {
		_, serr := s.cfg.Shared.Lookup(ctx, Caller{P: tenant.System}, ref, alias)
		if serr == nil { // another team's
			return ref, true, unknownTemplate(ref)
		}
		if !errdefs.Is(serr, errdefs.KindNotFound) {
			return ref, true, serr
		}
		// Not the cluster's (any more): a local copy of an API template
		// of that name was deleted from the cluster. (One made before this
		// node joined a cluster has never had a record: it stays.)
		if t, _, ferr := s.findTemplate(ctx, Caller{P: tenant.System}, ref, false); ferr == nil && t.Shared {
			if _, derr := s.Delete(ctx, Caller{P: tenant.System}, t.ID, nil); derr != nil {
				s.log.Warn("template deleted from the cluster: dropping the local copy failed", "template", t.ID, "err", derr)
			} else {
				s.log.Info("template deleted from the cluster: local copy dropped", "template", t.ID)
			}
			return ref, true, unknownTemplate(ref)
		}
		return ref, false, nil
	}
	if err != nil {
		// The cluster's API is out of reach: what this node has serves
		// meanwhile (a template of the cluster it lacks is not found).
		s.log.Warn("cluster: the template records are out of reach; resolving among this node's templates", "template", ref, "err", err)
		return ref, false, nil
	}
	sb, ok := st.tag(n.Tag)
	if !ok {
		return ref, true, errdefs.NotFound("tag '%s' does not exist for template '%s'", n.Tag, cmp.Or(st.Alias, st.ID))
	}
	if sb.Digest == "" {
		return ref, true, errdefs.NotFound("template %q has no finished build yet", ref)
	}
	name = storeName(st.ID, sb.Build)
	pick := st // what is fetched: the tag's build
	pick.SharedBuild = sb
	if s.haveBuild(ctx, sb.Build, name) {
		return name, true, s.syncPublic(ctx, st)
	}
	if err := s.recentStartFailure(name); err != nil {
		return ref, true, err
	}
	// One import per build, however many creates wait for it: the start
	// command's snapshot is taken once. It is every waiting create's, so
	// it goes on when the create that began it gives up (the next create
	// finds it done), and ends with the service; a create stops waiting
	// when its own request ends.
	done := s.imports.DoChan(name, func() (_ any, err error) {
		s.wg.Add(1)
		defer s.wg.Done()
		defer func() {
			// Not this flight's panic taking the daemon down from the
			// goroutine DoChan runs it in: the waiting creates' error.
			if p := recover(); p != nil {
				err = errdefs.Internal("importing template %s: %v", st.ID, p)
			}
		}()
		ictx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		defer cancel()
		defer context.AfterFunc(s.ctx, cancel)()
		if err := s.recentStartFailure(name); err != nil {
			return nil, err // a flight that failed while this create looked
		}
		if s.haveBuild(ictx, sb.Build, name) {
			return nil, nil
		}
		if err := s.cfg.Shared.Fetch(ictx, pick, name); err != nil {
			return nil, err
		}
		if err := s.prepareShared(ictx, pick, name); err != nil {
			return nil, err
		}
		return nil, s.importShared(ictx, st, sb, name)
	})
	select {
	case r := <-done:
		if r.Err != nil {
			return ref, true, r.Err
		}
		return name, true, nil
	case <-ctx.Done():
		return ref, true, fmt.Errorf("waiting for template %s to be pulled to this node: %w", ref, ctx.Err())
	}
}

// startRetryAfter is how long a pulled build's failed start command
// fails the creates of it here before the next create runs it again. A
// start command that fails on a pulling node and not on its builder
// mostly needs what a pulling node never gives it (egress: see
// prepareShared), and each run boots a build sandbox for up to the ready
// timeout; a minute still lets a passing failure mend without a rebuild.
const startRetryAfter = time.Minute

// failedStart is a pulled build's start command failing here.
type failedStart struct {
	err   error
	retry time.Time // when the next create runs the start command again
}

// recentStartFailure is the failure of name's start command here while
// it is recent (startRetryAfter), nil otherwise.
func (s *Service) recentStartFailure(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.startFailed[name]
	if !ok {
		return nil
	}
	if !time.Now().Before(f.retry) {
		delete(s.startFailed, name)
		return nil
	}
	return fmt.Errorf("%w (this node runs it again for a create from %s)", f.err, f.retry.UTC().Format(time.RFC3339))
}

// startFailedNow remembers that name's start command failed here with err
// (and forgets the failures due for a retry: builds deleted or replaced
// since are never asked for again).
func (s *Service) startFailedNow(name string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for n, f := range s.startFailed {
		if !now.Before(f.retry) {
			delete(s.startFailed, n)
		}
	}
	s.startFailed[name] = failedStart{err: err, retry: now.Add(startRetryAfter)}
}

// haveBuild says whether build is here, as the template-store name name.
func (s *Service) haveBuild(ctx context.Context, build, name string) bool {
	if _, err := s.cfg.Store.GetBuild(ctx, build); err != nil {
		return false
	}
	_, err := s.cfg.Templates.Get(name)
	return err == nil
}

// prepareShared makes a pulled build name what its build made on the
// builder: the services the record names, and, for a start (or ready)
// command its image carries, this node's own memory snapshot of it
// running (a snapshot is the node's: its runtime's and its memory's; the
// registry holds only the layers). The command runs in a build sandbox
// of this node with the build's sizes and no egress (see below).
func (s *Service) prepareShared(ctx context.Context, st SharedTemplate, name string) error {
	t, err := s.cfg.Templates.Get(name)
	if err != nil {
		return fmt.Errorf("import template %s: %w", st.ID, err)
	}
	if len(st.Services) > 0 && !slices.Equal(t.Services, st.Services) {
		if t, err = s.cfg.Templates.Name(name, t.Image, t.Snapshot, st.Services); err != nil {
			return fmt.Errorf("import template %s: its services: %w", st.ID, err)
		}
	}
	if t.StartCmd == "" && t.ReadyCmd == "" {
		return nil
	}
	if s.cfg.Starter == nil {
		return errdefs.NotImplemented("template %q has a start command, and this node runs no builds to capture it", st.ID)
	}
	start := time.Now()
	s.log.Info("cluster: running a pulled template's start command for its snapshot", "template", st.ID, "build", st.Build)
	// The start command is the template author's code. On the builder it
	// ran with the build egress within the building key's ceiling, which
	// this node does not know, and the key whose create brought it here
	// is not the author's (its ceiling may be wider: another team's on a
	// public template, an admin's): so here it runs with no egress at all,
	// as the author's team's.
	capturer := tenant.Principal{Team: st.Team, Ceiling: &egress.Policy{}}
	var last build.LogEntry
	err = s.cfg.Starter.CaptureStart(ctx, capturer, name, build.Sizes{CPUs: st.CPUCount, MemoryMB: st.MemoryMB}, func(e build.LogEntry) {
		if e.Level == build.LevelError || e.Level == build.LevelWarn {
			last = e
		}
	})
	if err != nil {
		s.log.Warn("cluster: a pulled template's start command failed", "template", st.ID, "build", st.Build, "err", err, "log", last.Message)
		if !build.IsCommandFailure(err) { // this node's trouble, not the template's: the next create tries again
			return errdefs.Unavailable("template %q: running its start command on this node for its snapshot failed: %v", st.ID, err)
		}
		err = errdefs.Unavailable("template %q: its start command, run on this node for its snapshot, failed: %v (a start command on a node that pulled its template has no egress)", st.ID, err)
		s.startFailedNow(name, err)
		return err
	}
	s.log.Info("cluster: captured a pulled template's start command", "template", st.ID, "build", st.Build, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// importShared records a fetched build here as the cluster has it: the
// template (same ID, alias and team), the build, ready, and the tags of
// the record that name it. Each row may exist already (a concurrent
// import, or an earlier build of the template).
func (s *Service) importShared(ctx context.Context, st SharedTemplate, sb SharedBuild, name string) error {
	now := time.Now()
	t := store.APITemplate{ID: st.ID, Alias: st.Alias, TeamID: st.Team, Public: st.Public, CreatedAt: now, UpdatedAt: now, Shared: true}
	if err := s.cfg.Store.PutAPITemplate(ctx, t); err != nil && !errors.Is(err, store.ErrExists) {
		return fmt.Errorf("import template %s: %w", st.ID, err)
	}
	if err := s.syncPublic(ctx, st); err != nil {
		return err
	}
	tags := st.tagsOf(sb.Build)
	b := store.Build{ID: sb.Build, TemplateID: st.ID, Status: StatusReady, Tags: tags, StoreName: name,
		CPUCount: cmp.Or(sb.CPUCount, DefaultCPUCount), MemoryMB: cmp.Or(sb.MemoryMB, DefaultMemoryMB), CreatedAt: now, UpdatedAt: now, FinishedAt: now}
	if _, err := s.cfg.Store.GetBuild(ctx, b.ID); errors.Is(err, store.ErrNotFound) {
		if err := s.cfg.Store.PutBuild(ctx, b); err != nil {
			if _, gerr := s.cfg.Store.GetBuild(ctx, b.ID); gerr != nil { // not a concurrent import's
				return fmt.Errorf("import template %s: %w", st.ID, err)
			}
		}
	}
	for _, tag := range tags {
		if err := s.cfg.Store.SetTag(ctx, st.ID, tag, b.ID); err != nil {
			return fmt.Errorf("import template %s: %w", st.ID, err)
		}
	}
	return nil
}

// tagsOf are the record's tags that name build.
func (st SharedTemplate) tagsOf(build string) []string {
	var tags []string
	if st.SharedBuild.Build == build {
		tags = append(tags, DefaultTag)
	}
	for tag, b := range st.Tags {
		if b.Build == build {
			tags = append(tags, tag)
		}
	}
	slices.Sort(tags)
	return tags
}

// localOnly says whether ref never names a cluster template: a build's
// store name, or a builtin.
func localOnly(ref string) bool { return IsStoreName(ref) || template.IsBuiltin(ref) }

// syncPublic makes this node's copy as public as the cluster's record (a
// publish went through the building node).
func (s *Service) syncPublic(ctx context.Context, st SharedTemplate) error {
	cur, err := s.cfg.Store.GetAPITemplate(ctx, st.ID)
	if err != nil || cur.Public == st.Public {
		return nil
	}
	if err := s.cfg.Store.SetAPITemplatePublic(ctx, st.ID, st.Public); err != nil {
		return fmt.Errorf("template %s: record its publication: %w", st.ID, err)
	}
	return nil
}
