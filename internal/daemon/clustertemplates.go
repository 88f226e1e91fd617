package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/cella-sandbox/cella/internal/builds"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// sharedTemplates are a cluster node's API templates as the cluster holds
// them (builds.Shared): Template records in the Kubernetes API, images in
// the cluster's template registry (--template-registry), pushed by the
// node that built them and pulled by digest by every other node on first
// use. A node pulls only from that registry, at the reference it would
// have pushed to: a record naming any other image is refused.
type sharedTemplates struct {
	records *cluster.Records
	tpls    *template.Store
	node    string
	// registry is REGISTRY/PREFIX ("": builds are not shared).
	registry string
	log      *slog.Logger
	pulls    singleflight.Group
}

var _ builds.Shared = (*sharedTemplates)(nil)

// reference is where build of template id is pushed.
func (s *sharedTemplates) reference(id, build string) string {
	return s.registry + "/" + id + ":" + build
}

func (s *sharedTemplates) Lookup(ctx context.Context, c builds.Caller, id, alias string) (builds.SharedTemplate, error) {
	// What the caller owns first, then what is published: a name both
	// is the caller's own.
	t, err := s.records.FindTemplate(ctx, id, alias, func(t *v1alpha1.Template) bool { return c.P.Can(tenant.Owner{Team: t.Spec.Team}) })
	if errdefs.Is(err, errdefs.KindNotFound) {
		t, err = s.records.FindTemplate(ctx, id, alias, func(t *v1alpha1.Template) bool { return t.Spec.Public })
	}
	if err != nil {
		return builds.SharedTemplate{}, err
	}
	st := builds.SharedTemplate{ID: t.Name, Team: t.Spec.Team, Public: t.Spec.Public, SharedBuild: sharedBuild(t.Spec.TemplateBuild)}
	if len(t.Spec.Aliases) > 0 {
		st.Alias = t.Spec.Aliases[0]
	}
	for _, tg := range t.Spec.Tags {
		if st.Tags == nil {
			st.Tags = map[string]builds.SharedBuild{}
		}
		st.Tags[tg.Tag] = sharedBuild(tg.TemplateBuild)
	}
	return st, nil
}

func sharedBuild(b v1alpha1.TemplateBuild) builds.SharedBuild {
	return builds.SharedBuild{Build: b.Build, Reference: b.Reference, Digest: b.Digest, CPUCount: b.CPUCount, MemoryMB: b.MemoryMB,
		Services: slices.Clone(b.Services)}
}

// claim sets the record's owner, alias and builder to t's and this node,
// refusing a record of another team.
func (s *sharedTemplates) claim(cr *v1alpha1.Template, t store.APITemplate) error {
	if cr.ResourceVersion != "" && cr.Spec.Team != t.TeamID {
		return errdefs.Conflict("template %s is another team's in the cluster", t.ID)
	}
	cr.Spec.Team, cr.Spec.Node = t.TeamID, s.node
	if !slices.Contains(cr.Spec.Aliases, t.Alias) {
		cr.Spec.Aliases = append(cr.Spec.Aliases, t.Alias)
	}
	return nil
}

func (s *sharedTemplates) ReserveAlias(ctx context.Context, alias, team, id string) (string, error) {
	return s.records.ReserveAlias(ctx, alias, team, id)
}

func (s *sharedTemplates) Building(ctx context.Context, t store.APITemplate, b store.Build) error {
	// A template this node had before it joined the cluster reaches the
	// cluster here, at its first build on it: its alias must be free.
	held, err := s.records.ReserveAlias(ctx, t.Alias, t.TeamID, t.ID)
	if err != nil {
		return err
	}
	if held != t.ID {
		return errdefs.Conflict("Alias '%s' is already your team's template %s in the cluster", t.Alias, held)
	}
	_, err = s.records.EditTemplate(ctx, t.ID, func(cr *v1alpha1.Template) error { return s.claim(cr, t) })
	return err
}

func (s *sharedTemplates) Publish(ctx context.Context, t store.APITemplate, b store.Build, current bool, logf func(string)) error {
	if s.registry == "" {
		logf("Not shared with the cluster's other nodes: this node has no --template-registry")
		return nil
	}
	ref := s.reference(t.ID, b.ID)
	tpl, err := s.tpls.Get(b.StoreName)
	if err != nil {
		return fmt.Errorf("push to the cluster's template registry: %w", err)
	}
	logf("Pushing the template to the cluster's registry: " + ref)
	pushed, err := s.tpls.Push(ctx, b.StoreName, ref, template.PullOptions{}, nil)
	if err != nil {
		return fmt.Errorf("push to the cluster's template registry %s: %w", s.registry, err)
	}
	_, digest, ok := strings.Cut(pushed, "@")
	if !ok {
		return fmt.Errorf("push to the cluster's template registry: %q names no digest", pushed)
	}
	if _, err := s.records.EditTemplate(ctx, t.ID, func(cr *v1alpha1.Template) error {
		if err := s.claim(cr, t); err != nil {
			return err
		}
		// The build's tags name it from now on, on every node.
		pushedBuild := v1alpha1.TemplateBuild{Reference: ref, Digest: digest, Build: b.ID, CPUCount: b.CPUCount, MemoryMB: b.MemoryMB,
			Services: slices.Clone(tpl.Services)}
		tags := b.Tags
		if current {
			tags = append([]string{v1alpha1.DefaultTag}, tags...)
		}
		for _, tag := range tags {
			cr.Spec.SetTag(tag, pushedBuild)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("record the pushed template: %w", err)
	}
	logf("Pushed " + ref + " as " + digest)
	return nil
}

func (s *sharedTemplates) Fetch(ctx context.Context, st builds.SharedTemplate, name string) error {
	_, err, _ := s.pulls.Do(name, func() (any, error) {
		// Shared by every create waiting for it: the first one's client
		// going away does not cancel the others' pull.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pullTimeout)
		defer cancel()
		return nil, s.fetch(pctx, st, name)
	})
	return err
}

// pullTimeout bounds one pull of a template: a registry that stops
// answering fails the creates waiting for it instead of holding them.
const pullTimeout = 15 * time.Minute

func (s *sharedTemplates) fetch(ctx context.Context, st builds.SharedTemplate, name string) error {
	if s.registry == "" {
		return errdefs.Unavailable("template %q was built on another node, and this node has no --template-registry to pull it from", st.ID)
	}
	want := s.reference(st.ID, st.Build)
	if st.Reference != want {
		return errdefs.FailedPrecondition("template %q: its cluster record names the image %q, not %q in this node's template registry %s: refused",
			st.ID, st.Reference, want, s.registry)
	}
	src := s.registry + "/" + st.ID + "@" + st.Digest
	s.log.Info("cluster: pulling a template built on another node", "template", st.ID, "build", st.Build, "image", src)
	start := time.Now()
	t, err := s.tpls.Pull(ctx, name, src, template.PullOptions{})
	if err != nil {
		return errdefs.Unavailable("template %q: pulling %s from the cluster's template registry %s failed: %v", st.ID, src, s.registry, err)
	}
	if t.Digest != st.Digest {
		if derr := s.tpls.Delete(name); derr != nil {
			s.log.Warn("cluster: removing a refused template failed", "template", name, "err", derr)
		}
		return errdefs.FailedPrecondition("template %q: the registry %s served %s for %s: refused", st.ID, s.registry, t.Digest, src)
	}
	s.log.Info("cluster: pulled a template built on another node", "template", st.ID, "build", st.Build, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

func (s *sharedTemplates) Published(ctx context.Context, id string, public bool) error {
	_, err := s.records.EditTemplate(ctx, id, func(cr *v1alpha1.Template) error {
		if cr.ResourceVersion == "" {
			return errdefs.NotFound("template %q has no cluster record", id)
		}
		cr.Spec.Public = public
		return nil
	})
	return err
}

func (s *sharedTemplates) AssignTags(ctx context.Context, id, from string, tags []string) (string, error) {
	var build string
	_, err := s.records.EditTemplate(ctx, id, func(cr *v1alpha1.Template) error {
		src, ok := cr.Spec.Tag(from)
		if cr.ResourceVersion == "" || !ok {
			return errdefs.NotFound("tag '%s' of template %q has no build in the cluster's record", from, id)
		}
		for _, tag := range tags {
			cr.Spec.SetTag(tag, src)
		}
		build = src.Build
		return nil
	})
	return build, err
}

func (s *sharedTemplates) RemoveTags(ctx context.Context, id string, tags []string) error {
	_, err := s.records.EditTemplate(ctx, id, func(cr *v1alpha1.Template) error {
		if cr.ResourceVersion == "" {
			return errdefs.NotFound("template %q has no cluster record", id)
		}
		for _, tag := range tags {
			cr.Spec.RemoveTag(tag)
		}
		return nil
	})
	return err
}

func (s *sharedTemplates) Deleted(ctx context.Context, id string) error {
	t, err := s.records.Template(ctx, id)
	if errdefs.Is(err, errdefs.KindNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := s.records.DeleteTemplate(ctx, t); err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
		return err
	}
	return nil
}
