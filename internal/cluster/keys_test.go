package cluster_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/quota"
	"github.com/cella-sandbox/cella/internal/store"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestKeys: the cluster's API keys in their Secret — made, authenticated,
// listed, their quota changed and deleted; eight concurrent creates all
// land (each write resourceVersion-checked and retried); the admin key is
// recorded once however many nodes start; and the Secret holds no key,
// only hashes.
func TestKeys(t *testing.T) {
	cl, ns := env(t)
	ctx := ctxT(t)
	keys := cluster.NewKeys(cl, ns)
	admin, err := cluster.AdminKey(ctx, cl, ns, store.NewKeySecret)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := cluster.AdminKey(ctx, cl, ns, store.NewKeySecret); err != nil || again != admin {
		t.Fatalf("a second node's admin key: %q %v", again, err)
	}
	if k, err := keys.LookupAPIKey(ctx, admin); err != nil || k.ID != store.AdminKeyID || k.TeamID != store.AdminTeamID {
		t.Fatalf("the admin key authenticates as %+v %v", k, err)
	}

	var mu sync.Mutex
	secrets := map[string]string{} // key ID -> key
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, s, err := keys.CreateAPIKey(ctx, store.NewKey{Name: "k" + string(rune('a'+i)), Team: "alpha"})
			if err != nil {
				t.Errorf("create %d: %v", i, err)
				return
			}
			mu.Lock()
			secrets[k.ID] = s
			mu.Unlock()
		}()
	}
	wg.Wait()
	list, err := keys.ListAPIKeys(ctx)
	if err != nil || len(list) != 9 {
		t.Fatalf("list: %d keys, %v; want 9 (admin and 8 made at once)", len(list), err)
	}
	for id, s := range secrets {
		k, err := keys.LookupAPIKey(ctx, s)
		if err != nil || k.ID != id || k.TeamID != "alpha" {
			t.Errorf("key %s authenticates as %+v %v", id, k, err)
		}
	}
	if _, err := keys.LookupAPIKey(ctx, "e2b_0123456789abcdef0123456789abcdef"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("an unknown key: %v, want not found", err)
	}
	if _, _, err := keys.CreateAPIKey(ctx, store.NewKey{Name: "x", Team: store.AdminTeamID}); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Errorf("a key joining the admin team: %v, want refused", err)
	}
	own, ownSecret, err := keys.CreateAPIKey(ctx, store.NewKey{Name: "solo"})
	if err != nil || own.TeamID == "" || own.TeamID == "alpha" {
		t.Fatalf("a key with no team gets its own: %+v %v", own, err)
	}

	lim := quota.Limits{MaxSandboxes: 3, CreateRate: quota.Rate{N: 5, Per: time.Minute}}
	if _, err := keys.SetKeyLimits(ctx, own.ID, lim); err != nil {
		t.Fatal(err)
	}
	if k, err := keys.GetAPIKey(ctx, own.ID); err != nil || k.Limits != lim {
		t.Fatalf("limits read back %+v %v, want %+v", k.Limits, err, lim)
	}

	s := &corev1.Secret{}
	if err := cl.Get(ctx, types.NamespacedName{Namespace: ns, Name: cluster.KeysSecret}, s); err != nil {
		t.Fatal(err)
	}
	for _, v := range s.Data {
		for _, sec := range append([]string{admin, ownSecret}, values(secrets)...) {
			if strings.Contains(string(v), sec) {
				t.Fatalf("the keys' Secret holds a key in the clear")
			}
		}
	}
	if _, ok := s.Data[store.HashKey(ownSecret)]; !ok {
		t.Errorf("the Secret is not keyed by the keys' hashes")
	}

	if err := keys.DeleteAPIKey(ctx, own.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := keys.LookupAPIKey(context.Background(), ownSecret); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a deleted key still authenticates: %v", err)
	}
	if err := keys.DeleteAPIKey(ctx, own.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("delete again: %v, want not found", err)
	}
}

func values(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
