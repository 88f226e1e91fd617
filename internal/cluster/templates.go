package cluster

import (
	"context"
	"regexp"
	"slices"
	"strings"

	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/errdefs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The cluster's API templates are Template resources, named by template
// ID: the team that owns one, its aliases, the node that builds it and,
// once its first build is pushed, the OCI reference and digest every node
// pulls it from. A team's aliases name one template cluster-wide.

// objectName is what a record's name may be (a DNS subdomain).
var objectName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)

// Templates lists the recorded templates.
func (r *Records) Templates(ctx context.Context) ([]v1alpha1.Template, error) {
	var l v1alpha1.TemplateList
	if err := r.c.List(ctx, &l, client.InNamespace(r.ns)); err != nil {
		return nil, kindOf(err, "list templates")
	}
	return l.Items, nil
}

// FindTemplate is the template named id, else the one with alias, among
// the records can accepts; an unknown one and one can refuses are both
// NotFound (a tenant must not tell them apart). alias may be E2B's
// namespace/alias: then only a record of that team (a team's ID is its
// name on a cluster) matches, as E2B scopes names by team.
func (r *Records) FindTemplate(ctx context.Context, id, alias string, can func(*v1alpha1.Template) bool) (*v1alpha1.Template, error) {
	if objectName.MatchString(id) { // anything else (an alias:tag, team/alias) names no record
		t, err := r.Template(ctx, id)
		if err == nil && can(t) {
			return t, nil
		}
		if err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
			return nil, err
		}
	}
	namespace, alias := splitNamespace(alias)
	if alias != "" {
		all, err := r.Templates(ctx)
		if err != nil {
			return nil, err
		}
		for i := range all {
			if namespace != "" && !strings.EqualFold(all[i].Spec.Team, namespace) {
				continue
			}
			if slices.Contains(all[i].Spec.Aliases, alias) && can(&all[i]) {
				return &all[i], nil
			}
		}
	}
	return nil, errdefs.NotFound("template %q not found", id)
}

// EditTemplate applies edit to the record of template id (a new one if
// there is none) and writes it, resourceVersion-checked: a record another
// writer changed meanwhile is read again and edit applied again.
func (r *Records) EditTemplate(ctx context.Context, id string, edit func(t *v1alpha1.Template) error) (*v1alpha1.Template, error) {
	for attempt := 0; ; attempt++ {
		t, err := r.Template(ctx, id)
		if errdefs.Is(err, errdefs.KindNotFound) {
			t, err = &v1alpha1.Template{ObjectMeta: metav1.ObjectMeta{Name: id}}, nil
		}
		if err != nil {
			return nil, err
		}
		if err := edit(t); err != nil {
			return nil, err
		}
		err = r.PutTemplate(ctx, t)
		if err == nil {
			return t, nil
		}
		// Created meanwhile (exists) or updated meanwhile (conflict).
		if !errdefs.Is(err, errdefs.KindConflict) || attempt == 5 {
			return nil, err
		}
	}
}

// DeleteTemplate removes the record of t if it is still at
// t.ResourceVersion (a record someone changed since is a conflict), then
// the alias reservations it held. The template is deleted once its record
// is: a reservation whose release fails names no record from then on, and
// the next claimant of the alias (or SweepAliases) takes it over after
// staleAlias, so that failure is not the delete's.
func (r *Records) DeleteTemplate(ctx context.Context, t *v1alpha1.Template) error {
	rv, uid := t.ResourceVersion, t.UID
	if err := r.c.Delete(ctx, t, client.Preconditions{ResourceVersion: &rv, UID: &uid}); err != nil {
		return kindOf(err, "delete template %s", t.Name)
	}
	_ = r.ReleaseAliases(ctx, t)
	return nil
}
