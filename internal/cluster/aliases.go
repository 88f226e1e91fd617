package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/errdefs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A template alias names one template cluster-wide, and one team holds
// it. Reading the Template records to see whether an alias is free is no
// reservation: two nodes asking at once both find it free. So the alias
// is taken by creating a TemplateAlias named after it, which the API
// server lets exactly one writer do; the others read who holds it.

// staleAlias is how long a reservation may name no Template record: the
// building node writes the record right after it reserves (milliseconds),
// so one older than this belongs to a node that died in between, and the
// next claimant takes it over instead of the alias staying held by
// nothing.
const staleAlias = time.Minute

// AliasRecordName is the TemplateAlias name of alias.
func AliasRecordName(alias string) string {
	h := sha256.Sum256([]byte(alias))
	return "a" + hex.EncodeToString(h[:20])
}

// errAliasTaken is E2B's answer for an alias of another team, word for
// word (the SDK shows it as BuildError "409: ...").
func errAliasTaken(alias string) error {
	return errdefs.Conflict("Alias '%s' is already used by another team", alias)
}

// ReserveAlias takes alias for team's template id. It returns the template
// ID the alias is team's by: id, or the template another request of team
// reserved it for first (a rebuild then keeps one ID). An alias another
// team holds is a conflict.
func (r *Records) ReserveAlias(ctx context.Context, alias, team, id string) (string, error) {
	for range 3 {
		a := &v1alpha1.TemplateAlias{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: AliasRecordName(alias)},
			Spec: v1alpha1.TemplateAliasSpec{Alias: alias, Team: team, Template: id}}
		err := kindOf(r.c.Create(ctx, a), "reserve template alias %s", alias)
		if err == nil {
			return id, nil
		}
		if !errdefs.Is(err, errdefs.KindConflict) {
			return "", err
		}
		held, err := r.alias(ctx, alias)
		if errdefs.Is(err, errdefs.KindNotFound) {
			continue // released meanwhile
		}
		if err != nil {
			return "", err
		}
		if held.Spec.Team == team {
			return held.Spec.Template, nil
		}
		live, err := r.aliasInUse(ctx, held)
		if err != nil {
			return "", err
		}
		if live {
			return "", errAliasTaken(alias)
		}
		// Held by nothing (its node died between reservation and record,
		// or between the record's deletion and the reservation's): take
		// it over, unless someone else just did.
		if err := r.deleteAlias(ctx, held); err != nil && !errdefs.Is(err, errdefs.KindNotFound) && !errdefs.Is(err, errdefs.KindConflict) {
			return "", err
		}
	}
	return "", errdefs.Conflict("Alias '%s' is being reserved by another request; retry", alias)
}

// aliasInUse says whether a reservation still stands for something: a
// Template record of its team that has the alias, or a reservation young
// enough that its record may still be on its way.
func (r *Records) aliasInUse(ctx context.Context, a *v1alpha1.TemplateAlias) (bool, error) {
	t, err := r.Template(ctx, a.Spec.Template)
	if err == nil && t.Spec.Team == a.Spec.Team && slices.Contains(t.Spec.Aliases, a.Spec.Alias) {
		return true, nil
	}
	if err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
		return false, err
	}
	return time.Since(a.CreationTimestamp.Time) < staleAlias, nil
}

// ReleaseAliases drops the reservations t's aliases hold for t (one that
// another template holds by now is left alone).
func (r *Records) ReleaseAliases(ctx context.Context, t *v1alpha1.Template) error {
	for _, alias := range t.Spec.Aliases {
		a, err := r.alias(ctx, alias)
		if errdefs.Is(err, errdefs.KindNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if a.Spec.Template != t.Name {
			continue
		}
		if err := r.deleteAlias(ctx, a); err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
			return err
		}
	}
	return nil
}

// SweepAliases drops the reservations that stand for nothing (see
// aliasInUse): what a node that died between two writes left. A claimant
// takes such an alias over anyway; the sweep keeps the list honest for
// whoever reads it (kubectl get templatealiases).
func (r *Records) SweepAliases(ctx context.Context) error {
	var l v1alpha1.TemplateAliasList
	if err := r.c.List(ctx, &l, client.InNamespace(r.ns)); err != nil {
		return kindOf(err, "list template aliases")
	}
	for i := range l.Items {
		live, err := r.aliasInUse(ctx, &l.Items[i])
		if err != nil {
			return err
		}
		if live {
			continue
		}
		if err := r.deleteAlias(ctx, &l.Items[i]); err != nil && !errdefs.Is(err, errdefs.KindNotFound) && !errdefs.Is(err, errdefs.KindConflict) {
			return err
		}
	}
	return nil
}

func (r *Records) alias(ctx context.Context, alias string) (*v1alpha1.TemplateAlias, error) {
	a := &v1alpha1.TemplateAlias{}
	if err := r.c.Get(ctx, types.NamespacedName{Namespace: r.ns, Name: AliasRecordName(alias)}, a); err != nil {
		return nil, kindOf(err, "template alias %s", alias)
	}
	return a, nil
}

// deleteAlias removes a if it is still as read.
func (r *Records) deleteAlias(ctx context.Context, a *v1alpha1.TemplateAlias) error {
	rv, uid := a.ResourceVersion, a.UID
	if err := r.c.Delete(ctx, a, client.Preconditions{ResourceVersion: &rv, UID: &uid}); err != nil {
		return kindOf(err, "release template alias %s", a.Spec.Alias)
	}
	return nil
}

// splitNamespace splits E2B's namespace/alias: a namespace is the team
// that owns the alias ("": any).
func splitNamespace(name string) (namespace, alias string) {
	if ns, a, ok := strings.Cut(name, "/"); ok {
		return ns, a
	}
	return "", name
}
