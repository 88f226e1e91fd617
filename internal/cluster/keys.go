package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/quota"
	"github.com/cella-sandbox/cella/internal/store"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A cluster's API keys are one Kubernetes Secret, cella-api-keys, so that
// every node and gateway knows every key: its data maps the SHA-256 of each
// key (the lookup: authenticating is one GET, no key is ever stored) to the
// key's public part. One Secret rather than one per key, so RBAC can name
// it (resourceNames does not take a prefix): nodes and gateways read no
// other Secret. Every change is resourceVersion-checked and retried on a
// conflict. Teams are named, and a team's ID is its name, so one team is
// one owner on every node.
const KeysSecret = "cella-api-keys"

// keyRecord is a key's public part as a Secret holds it.
type keyRecord struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"`
	Team        string   `json:"team"`
	CreatedAt   int64    `json:"createdAt"`
	MCPMaxCalls int64    `json:"mcpMaxCalls,omitempty"`
	EgressAllow []string `json:"egressAllow,omitempty"`
	Secrets     []string `json:"secrets,omitempty"`
	Limits      struct {
		MaxSandboxes int    `json:"maxSandboxes,omitempty"`
		MaxVCPUs     int    `json:"maxVCPUs,omitempty"`
		MaxMemoryMB  int64  `json:"maxMemoryMB,omitempty"`
		CreateRate   string `json:"createRate,omitempty"`
		RequestRate  string `json:"requestRate,omitempty"`
	} `json:"limits"`
}

func recordOf(k store.APIKey) keyRecord {
	r := keyRecord{ID: k.ID, Name: k.Name, Team: k.TeamID, CreatedAt: k.CreatedAt.Unix(), MCPMaxCalls: k.MCPMaxCalls,
		EgressAllow: k.EgressAllow, Secrets: k.Secrets}
	r.Limits.MaxSandboxes, r.Limits.MaxVCPUs, r.Limits.MaxMemoryMB = k.Limits.MaxSandboxes, k.Limits.MaxVCPUs, k.Limits.MaxMemoryMB
	r.Limits.CreateRate, r.Limits.RequestRate = k.Limits.CreateRate.String(), k.Limits.RequestRate.String()
	return r
}

func (r keyRecord) key() (store.APIKey, error) {
	k := store.APIKey{ID: r.ID, Name: r.Name, TeamID: r.Team, TeamName: r.Team, CreatedAt: time.Unix(r.CreatedAt, 0),
		MCPMaxCalls: r.MCPMaxCalls, EgressAllow: r.EgressAllow, Secrets: r.Secrets,
		Limits: quota.Limits{MaxSandboxes: r.Limits.MaxSandboxes, MaxVCPUs: r.Limits.MaxVCPUs, MaxMemoryMB: r.Limits.MaxMemoryMB}}
	var err error
	if k.Limits.CreateRate, err = quota.ParseRate(r.Limits.CreateRate); err != nil {
		return k, fmt.Errorf("api key %s: createRate: %w", r.ID, err)
	}
	if k.Limits.RequestRate, err = quota.ParseRate(r.Limits.RequestRate); err != nil {
		return k, fmt.Errorf("api key %s: requestRate: %w", r.ID, err)
	}
	return k, nil
}

// Keys are the cluster's API keys. It has the methods of a node's store
// that the API uses for keys (api.Keys without SandboxOwner, which stays
// the node's): a node of a cluster serves its key routes from here.
type Keys struct {
	c  client.Client
	ns string
}

// NewKeys keeps keys in namespace ns.
func NewKeys(c client.Client, ns string) *Keys { return &Keys{c: c, ns: ns} }

// notFound is a missing key, both a NotFound kind and store.ErrNotFound
// (what the API and the quota checks test for).
func notFound(format string, args ...any) error {
	return &errdefs.Error{Kind: errdefs.KindNotFound, Msg: fmt.Sprintf(format, args...), Err: store.ErrNotFound}
}

// read returns the keys' Secret (nil, nil when there is none yet).
func (k *Keys) read(ctx context.Context) (*corev1.Secret, error) {
	return readSecret(ctx, k.c, k.ns, KeysSecret)
}

func decodeKey(hash string, b []byte) (store.APIKey, error) {
	var r keyRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return store.APIKey{}, fmt.Errorf("secret %s: key %.8s…: %w", KeysSecret, hash, err)
	}
	return r.key()
}

// LookupAPIKey authenticates key.
func (k *Keys) LookupAPIKey(ctx context.Context, key string) (store.APIKey, error) {
	s, err := k.read(ctx)
	if err != nil {
		return store.APIKey{}, err
	}
	h := store.HashKey(key)
	if s == nil || s.Data[h] == nil {
		return store.APIKey{}, notFound("unknown API key")
	}
	return decodeKey(h, s.Data[h])
}

// all decodes every key of s, by hash.
func all(s *corev1.Secret) (map[string]store.APIKey, error) {
	out := map[string]store.APIKey{}
	if s == nil {
		return out, nil
	}
	for h, b := range s.Data {
		key, err := decodeKey(h, b)
		if err != nil {
			return nil, err
		}
		out[h] = key
	}
	return out, nil
}

// GetAPIKey reads key id's public part.
func (k *Keys) GetAPIKey(ctx context.Context, id string) (store.APIKey, error) {
	keys, err := k.ListAPIKeys(ctx)
	if err != nil {
		return store.APIKey{}, err
	}
	for _, key := range keys {
		if key.ID == id {
			return key, nil
		}
	}
	return store.APIKey{}, notFound("API key %q not found", id)
}

// ListAPIKeys lists every key's public part, oldest first.
func (k *Keys) ListAPIKeys(ctx context.Context) ([]store.APIKey, error) {
	s, err := k.read(ctx)
	if err != nil {
		return nil, err
	}
	m, err := all(s)
	if err != nil {
		return nil, err
	}
	out := make([]store.APIKey, 0, len(m))
	for _, key := range m {
		out = append(out, key)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// change applies fn to the keys (by hash) and writes the Secret back
// (editSecret: resourceVersion-checked, re-applied on a conflict).
func (k *Keys) change(ctx context.Context, what string, fn func(keys map[string]store.APIKey) error) error {
	return editSecret(ctx, k.c, k.ns, KeysSecret, RoleAPIKeys, what, func(data map[string][]byte) error {
		keys := make(map[string]store.APIKey, len(data))
		for h, b := range data {
			key, err := decodeKey(h, b)
			if err != nil {
				return err
			}
			keys[h] = key
		}
		if err := fn(keys); err != nil {
			return err
		}
		clear(data)
		for h, key := range keys {
			b, err := json.Marshal(recordOf(key))
			if err != nil {
				return err
			}
			data[h] = b
		}
		return nil
	})
}

// RoleAPIKeys is the LabelRole of the keys' Secret.
const RoleAPIKeys = "api-keys"

// CreateAPIKey makes a new key: its team is nk.Team, or a new team named
// after the key and its ID.
func (k *Keys) CreateAPIKey(ctx context.Context, nk store.NewKey) (store.APIKey, string, error) {
	secret, err := store.NewKeySecret()
	if err != nil {
		return store.APIKey{}, "", err
	}
	idb := make([]byte, 6)
	if _, err := rand.Read(idb); err != nil {
		return store.APIKey{}, "", err
	}
	id := "k" + hex.EncodeToString(idb)
	team := nk.Team
	if team == "" {
		team = nk.Name + "-" + id
	}
	if !store.TeamNameRe.MatchString(team) {
		return store.APIKey{}, "", errdefs.InvalidArgument("invalid team name %q: want 1-63 of a-z, 0-9, '.', '_' and '-'", team)
	}
	if team == store.AdminTeamID {
		return store.APIKey{}, "", errdefs.InvalidArgument("team %q is the admin key's: name another", team)
	}
	key := store.APIKey{ID: id, Name: nk.Name, TeamID: team, TeamName: team, CreatedAt: time.Now().Truncate(time.Second),
		MCPMaxCalls: nk.MCPMaxCalls, EgressAllow: nk.EgressAllow, Secrets: nk.Secrets, Limits: nk.Limits}
	err = k.change(ctx, "create api key "+nk.Name, func(keys map[string]store.APIKey) error {
		keys[store.HashKey(secret)] = key
		return nil
	})
	if err != nil {
		return store.APIKey{}, "", err
	}
	return key, secret, nil
}

// DeleteAPIKey removes key id (its team's resources stay).
func (k *Keys) DeleteAPIKey(ctx context.Context, id string) error {
	return k.change(ctx, "delete api key "+id, func(keys map[string]store.APIKey) error {
		for h, key := range keys {
			if key.ID == id {
				delete(keys, h)
				return nil
			}
		}
		return notFound("API key %q not found", id)
	})
}

// SetKeyLimits replaces key id's quota.
func (k *Keys) SetKeyLimits(ctx context.Context, id string, l quota.Limits) (store.APIKey, error) {
	var out store.APIKey
	err := k.change(ctx, "update api key "+id, func(keys map[string]store.APIKey) error {
		for h, key := range keys {
			if key.ID == id {
				key.Limits = l
				keys[h], out = key, key
				return nil
			}
		}
		return notFound("API key %q not found", id)
	})
	return out, err
}

// ensureAdmin records the cluster's admin key (ID store.AdminKeyID, team
// admin) unless it is already.
func (k *Keys) ensureAdmin(ctx context.Context, secret string) error {
	h := store.HashKey(secret)
	if s, err := k.read(ctx); err != nil || (s != nil && s.Data[h] != nil) {
		return err
	}
	return k.change(ctx, "record the admin key", func(keys map[string]store.APIKey) error {
		if _, ok := keys[h]; !ok {
			keys[h] = store.APIKey{ID: store.AdminKeyID, Name: "admin", TeamID: store.AdminTeamID, TeamName: store.AdminTeamID,
				CreatedAt: time.Now().Truncate(time.Second)}
		}
		return nil
	})
}
