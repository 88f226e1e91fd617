package cluster

import (
	"context"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// AnnotationDrain on a node's Lease marks it drained (the time it was, in
// RFC 3339): gateways place nothing there. The node's renewals keep the
// annotation as read, so the mark holds until SetDrain clears it.
const AnnotationDrain = "cella.dev/drain"

// SetDrain marks node drained (on) or clears the mark, with a
// resourceVersion-checked update retried while the node's own renewals
// win the race.
func SetDrain(ctx context.Context, c client.Client, ns, node string, on bool) error {
	key := types.NamespacedName{Namespace: ns, Name: LeaseName(node)}
	for attempt := 0; ; attempt++ {
		l := &coordinationv1.Lease{}
		if err := c.Get(ctx, key, l); err != nil {
			if errdefs.Is(kindOf(err, ""), errdefs.KindNotFound) {
				return errdefs.NotFound("node %s: no lease %s/%s (it has never joined, or left)", node, ns, key.Name)
			}
			return kindOf(err, "read lease %s", key.Name)
		}
		if _, marked := l.Annotations[AnnotationDrain]; marked == on {
			return nil
		}
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		if on {
			l.Annotations[AnnotationDrain] = time.Now().UTC().Format(time.RFC3339)
		} else {
			delete(l.Annotations, AnnotationDrain)
		}
		err := kindOf(c.Update(ctx, l), "mark lease %s", key.Name)
		if err == nil || !errdefs.Is(err, errdefs.KindConflict) || attempt == 20 {
			return err
		}
	}
}
