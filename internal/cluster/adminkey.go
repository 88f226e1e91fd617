package cluster

import (
	"context"

	"github.com/cella-sandbox/cella/internal/errdefs"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// AdminKeySecret is the Secret holding the cluster's admin API key (data
// key "key"): every node starts with it as its admin key, so one key works
// through any gateway on any node. An operator reads it with
// `kubectl -n NS get secret cella-admin-key -o jsonpath='{.data.key}' | base64 -d`.
const AdminKeySecret = "cella-admin-key"

// AdminKey returns the cluster's admin key, making it with newKey if no
// node has yet (create is atomic: of nodes starting together, one makes
// it and the others read it).
func AdminKey(ctx context.Context, c client.Client, ns string, newKey func() (string, error)) (string, error) {
	k, err := sharedSecret(ctx, c, ns, AdminKeySecret, "admin-key", func() ([]byte, error) {
		k, err := newKey()
		return []byte(k), err
	})
	return string(k), err
}

// sharedSecret returns data key "key" of Secret name, making it with
// newValue if no node has yet (create is atomic: of nodes starting
// together, one makes it and the others read it).
func sharedSecret(ctx context.Context, c client.Client, ns, name, role string, newValue func() ([]byte, error)) ([]byte, error) {
	key := types.NamespacedName{Namespace: ns, Name: name}
	for attempt := 0; attempt < 3; attempt++ {
		s := &corev1.Secret{}
		err := c.Get(ctx, key, s)
		if err == nil {
			if k := s.Data["key"]; len(k) > 0 {
				return k, nil
			}
			return nil, errdefs.InvalidArgument("secret %s/%s has no data key \"key\"", ns, name)
		}
		if !errdefs.Is(kindOf(err, ""), errdefs.KindNotFound) {
			return nil, kindOf(err, "read secret %s/%s", ns, name)
		}
		k, err := newValue()
		if err != nil {
			return nil, err
		}
		s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{LabelRole: role}},
			Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"key": k}}
		err = c.Create(ctx, s)
		if err == nil {
			return k, nil
		}
		if !errdefs.Is(kindOf(err, ""), errdefs.KindConflict) {
			return nil, kindOf(err, "create secret %s/%s", ns, name)
		}
		// Another node made it first: read theirs.
	}
	return nil, errdefs.Unavailable("secret %s/%s: could not read or create it", ns, name)
}
