package store

import (
	"context"
	"database/sql"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"
)

func openTest(t *testing.T, path string) *Store {
	t.Helper()
	st, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestNewKeySecret: "e2b_" and 32 hex digits, a new one each time.
func TestNewKeySecret(t *testing.T) {
	re := regexp.MustCompile(`^e2b_[0-9a-f]{32}$`)
	a, err := NewKeySecret()
	if err != nil || !re.MatchString(a) {
		t.Fatalf("NewKeySecret = %q, %v", a, err)
	}
	if b, _ := NewKeySecret(); b == a {
		t.Fatalf("two keys alike: %q", a)
	}
}

// TestAPIKeys: CreateAPIKey stores the budget and the egress ceiling with
// the key in one insert; AddAPIKey stores a key with neither.
func TestAPIKeys(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "cella.db"))
	before := time.Now().Truncate(time.Second)
	if err := st.AddAPIKey(ctx, AdminKeyID, "admin", "e2b_admin"); err != nil {
		t.Fatal(err)
	}
	k, key, err := st.CreateAPIKey(ctx, NewKey{Name: "ci", MCPMaxCalls: 7, EgressAllow: []string{"pkg.test", "*.github.com"}})
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^e2b_[0-9a-f]{32}$`).MatchString(key) || !regexp.MustCompile(`^k[0-9a-f]{12}$`).MatchString(k.ID) {
		t.Fatalf("key %q, id %q", key, k.ID)
	}
	plain, plainKey, err := st.CreateAPIKey(ctx, NewKey{Name: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.LookupAPIKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != k.ID || got.Name != "ci" || got.MCPMaxCalls != 7 || !slices.Equal(got.EgressAllow, []string{"pkg.test", "*.github.com"}) || !got.CreatedAt.Equal(k.CreatedAt) {
		t.Fatalf("looked up %+v, created %+v", got, k)
	}
	if got, err := st.LookupAPIKey(ctx, plainKey); err != nil || got.ID != plain.ID || got.EgressAllow != nil || got.MCPMaxCalls != 0 {
		t.Fatalf("plain key: %+v %v", got, err)
	}
	admin, err := st.LookupAPIKey(ctx, "e2b_admin")
	if err != nil || admin.ID != AdminKeyID || admin.Name != "admin" || admin.MCPMaxCalls != 0 || admin.EgressAllow != nil || admin.CreatedAt.Before(before) {
		t.Fatalf("admin key: %+v %v", admin, err)
	}
	if _, _, err := st.CreateAPIKey(ctx, NewKey{Name: "x"}); err != nil {
		t.Fatal(err)
	}
	if err := st.AddAPIKey(ctx, AdminKeyID, "again", "e2b_other"); err == nil {
		t.Fatal("a second key with the admin ID was stored")
	}
	keys, err := st.ListAPIKeys(ctx)
	if err != nil || len(keys) != 4 {
		t.Fatalf("ListAPIKeys = %+v, %v", keys, err)
	}
	if _, err := st.LookupAPIKey(ctx, "e2b_nope"); err != ErrNotFound {
		t.Fatalf("unknown key: %v", err)
	}
}

// TestOpenMigrates: a database of an older cella (api_keys without the
// budget and ceiling, no pools table) is brought up to date, and opening it
// again changes nothing.
func TestOpenMigrates(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "cella.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE api_keys (id TEXT PRIMARY KEY, name TEXT NOT NULL, hash TEXT NOT NULL UNIQUE, created_at INTEGER NOT NULL);
		INSERT INTO api_keys VALUES('admin','admin','` + HashKey("e2b_old") + `',1700000000)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	for range 2 {
		st, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		k, err := st.LookupAPIKey(ctx, "e2b_old")
		if err != nil || k.ID != AdminKeyID || k.MCPMaxCalls != 0 || k.EgressAllow != nil || k.CreatedAt.Unix() != 1700000000 {
			t.Fatalf("old key: %+v %v", k, err)
		}
		if err := st.PutPoolSize(ctx, PoolSize{Template: "base", Size: 2, UpdatedAt: time.UnixMilli(1700000000123)}); err != nil {
			t.Fatal(err)
		}
		if err := st.CreateSecret(ctx, Secret{ID: "sec_x", Name: "X", Ciphertext: []byte{1}, Version: 1, CreatedAt: time.Now(), UpdatedAt: time.Now()}); err == nil {
			st.DeleteSecret(ctx, "sec_x")
		} else {
			t.Fatal(err)
		}
		st.Close()
	}
}

// TestPoolSizes: the pools table comes with Open; a size replaces the
// template's earlier one.
func TestPoolSizes(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "cella.db"))
	if ps, err := st.ListPoolSizes(ctx); err != nil || len(ps) != 0 {
		t.Fatalf("fresh: %+v %v", ps, err)
	}
	at := time.UnixMilli(1700000000123)
	for _, p := range []PoolSize{{"code", 3, at}, {"base", 1, at}, {"code", 0, at.Add(time.Second)}} {
		if err := st.PutPoolSize(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	ps, err := st.ListPoolSizes(ctx)
	if err != nil || len(ps) != 2 || ps[0].Template != "base" || ps[0].Size != 1 || ps[1].Template != "code" || ps[1].Size != 0 || !ps[1].UpdatedAt.Equal(at.Add(time.Second)) {
		t.Fatalf("ListPoolSizes = %+v, %v", ps, err)
	}
}
