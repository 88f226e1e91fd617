package cluster

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/store"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A cluster's user secrets (/secrets) are one Kubernetes Secret,
// cella-secrets, so every node injects the same ones: its data maps each
// secret's name to its record (ID, version, metadata, times) with the value
// sealed exactly as a node's store seals it (secrets.Box, AES-GCM bound to
// the name) under the cluster's master key, the Secret cella-master-key
// (made by the first node). Every change is resourceVersion-checked.
const (
	SecretsSecret   = "cella-secrets"
	MasterKeySecret = "cella-master-key"
	roleSecrets     = "secrets"
)

// MasterKey returns the cluster's 32-byte master key, made by the first
// node that asks.
func MasterKey(ctx context.Context, c client.Client, ns string) ([]byte, error) {
	k, err := sharedSecret(ctx, c, ns, MasterKeySecret, "master-key", func() (string, error) {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		return base64.StdEncoding.EncodeToString(b), nil
	})
	if err != nil {
		return nil, err
	}
	b, err := base64.StdEncoding.DecodeString(k)
	if err != nil {
		return nil, fmt.Errorf("secret %s/%s: %w", ns, MasterKeySecret, err)
	}
	return b, nil
}

// SecretRecords are the cluster's sealed secrets: secrets.Records over
// cella-secrets.
type SecretRecords struct {
	c  client.Client
	ns string
}

// NewSecretRecords keeps secrets in namespace ns.
func NewSecretRecords(c client.Client, ns string) *SecretRecords { return &SecretRecords{c: c, ns: ns} }

func (r *SecretRecords) read(ctx context.Context) (*corev1.Secret, error) {
	return readSecret(ctx, r.c, r.ns, SecretsSecret)
}

// ListSecrets returns every sealed secret.
func (r *SecretRecords) ListSecrets(ctx context.Context) ([]store.Secret, error) {
	s, err := r.read(ctx)
	if err != nil || s == nil {
		return nil, err
	}
	out := make([]store.Secret, 0, len(s.Data))
	for name, b := range s.Data {
		var sec store.Secret
		if err := json.Unmarshal(b, &sec); err != nil {
			return nil, fmt.Errorf("secret %s: %s: %w", SecretsSecret, name, err)
		}
		out = append(out, sec)
	}
	return out, nil
}

// CreateSecret adds sec; a name taken is store.ErrSecretExists.
func (r *SecretRecords) CreateSecret(ctx context.Context, sec store.Secret) error {
	return r.change(ctx, "create secret "+sec.Name, func(data map[string][]byte) error {
		if data[sec.Name] != nil {
			return store.ErrSecretExists
		}
		return put(data, sec)
	})
}

// UpdateSecret replaces the secret of sec.ID; an unknown ID is
// store.ErrNotFound.
func (r *SecretRecords) UpdateSecret(ctx context.Context, sec store.Secret) error {
	return r.change(ctx, "update secret "+sec.Name, func(data map[string][]byte) error {
		name, err := nameOf(data, sec.ID)
		if err != nil {
			return err
		}
		delete(data, name)
		return put(data, sec)
	})
}

// DeleteSecret removes the secret of id; an unknown ID is
// store.ErrNotFound.
func (r *SecretRecords) DeleteSecret(ctx context.Context, id string) error {
	return r.change(ctx, "delete secret "+id, func(data map[string][]byte) error {
		name, err := nameOf(data, id)
		if err != nil {
			return err
		}
		delete(data, name)
		return nil
	})
}

func put(data map[string][]byte, sec store.Secret) error {
	b, err := json.Marshal(sec)
	if err != nil {
		return err
	}
	data[sec.Name] = b
	return nil
}

func nameOf(data map[string][]byte, id string) (string, error) {
	for name, b := range data {
		var sec store.Secret
		if json.Unmarshal(b, &sec) == nil && sec.ID == id {
			return name, nil
		}
	}
	return "", store.ErrNotFound
}

func (r *SecretRecords) change(ctx context.Context, what string, fn func(map[string][]byte) error) error {
	return editSecret(ctx, r.c, r.ns, SecretsSecret, roleSecrets, what, fn)
}

// readSecret reads Secret name (nil, nil when there is none yet).
func readSecret(ctx context.Context, c client.Client, ns, name string) (*corev1.Secret, error) {
	s := &corev1.Secret{}
	err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, s)
	if errdefs.Is(kindOf(err, ""), errdefs.KindNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, kindOf(err, "read secret %s/%s", ns, name)
	}
	return s, nil
}

// editSecret applies fn to Secret name's data and writes it back (made if
// it does not exist), checked against the resourceVersion read; on a
// conflict it reads again and re-applies. fn's own error ends it as is.
func editSecret(ctx context.Context, c client.Client, ns, name, role, what string, fn func(map[string][]byte) error) error {
	for attempt := 0; ; attempt++ {
		s, err := readSecret(ctx, c, ns, name)
		if err != nil {
			return err
		}
		data := map[string][]byte{}
		if s != nil {
			for k, v := range s.Data {
				data[k] = v
			}
		}
		if err := fn(data); err != nil {
			return err
		}
		if s == nil {
			s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{LabelRole: role}},
				Type: corev1.SecretTypeOpaque, Data: data}
			err = c.Create(ctx, s)
		} else {
			s.Data = data
			err = c.Update(ctx, s)
		}
		err = kindOf(err, "%s: write secret %s/%s", what, ns, name)
		if err == nil || !errdefs.Is(err, errdefs.KindConflict) || attempt == 10 {
			return err
		}
	}
}
