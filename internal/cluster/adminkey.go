package cluster

import (
	"context"
	"crypto/rand"
	"encoding/base64"

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

// GatewaySecret is the Secret holding the key of the gateways' assertions
// to nodes (internal/gatewayauth; data key "key"): only gateways and nodes
// may read it.
const GatewaySecret = "cella-gateway-key"

// AdminKey returns the cluster's admin key, making it with newKey if no
// node has yet, and makes sure the cluster's keys (Keys) know it.
func AdminKey(ctx context.Context, c client.Client, ns string, newKey func() (string, error)) (string, error) {
	k, err := sharedSecret(ctx, c, ns, AdminKeySecret, "admin-key", newKey)
	if err != nil {
		return "", err
	}
	if err := NewKeys(c, ns).ensureAdmin(ctx, k); err != nil {
		return "", err
	}
	return k, nil
}

// ReadAdminKey reads the cluster's admin key (made by the first node).
func ReadAdminKey(ctx context.Context, c client.Client, ns string) (string, error) {
	return sharedSecret(ctx, c, ns, AdminKeySecret, "admin-key", nil)
}

// GatewayKey returns the key of gateway assertions; create makes it if no
// node has yet (a gateway only reads it: nodes make it).
func GatewayKey(ctx context.Context, c client.Client, ns string, create bool) ([]byte, error) {
	gen := func() (string, error) {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		return base64.RawStdEncoding.EncodeToString(b), nil
	}
	if !create {
		gen = nil
	}
	k, err := sharedSecret(ctx, c, ns, GatewaySecret, "gateway-key", gen)
	return []byte(k), err
}

// sharedSecret reads Secret name's data key "key", making it with gen if
// it does not exist yet and gen is not nil (create is atomic: of nodes
// starting together, one makes it and the others read it).
func sharedSecret(ctx context.Context, c client.Client, ns, name, role string, gen func() (string, error)) (string, error) {
	key := types.NamespacedName{Namespace: ns, Name: name}
	for attempt := 0; attempt < 3; attempt++ {
		s := &corev1.Secret{}
		err := c.Get(ctx, key, s)
		if err == nil {
			if k := string(s.Data["key"]); k != "" {
				return k, nil
			}
			return "", errdefs.InvalidArgument("secret %s/%s has no data key \"key\"", ns, name)
		}
		if !errdefs.Is(kindOf(err, ""), errdefs.KindNotFound) {
			return "", kindOf(err, "read secret %s/%s", ns, name)
		}
		if gen == nil {
			return "", errdefs.Unavailable("secret %s/%s does not exist yet: a node makes it when it first joins", ns, name)
		}
		k, err := gen()
		if err != nil {
			return "", err
		}
		s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{LabelRole: role}},
			Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"key": []byte(k)}}
		err = c.Create(ctx, s)
		if err == nil {
			return k, nil
		}
		if !errdefs.Is(kindOf(err, ""), errdefs.KindConflict) {
			return "", kindOf(err, "create secret %s/%s", ns, name)
		}
		// Another node made it first: read theirs.
	}
	return "", errdefs.Unavailable("secret %s/%s: could not read or create it", ns, name)
}
