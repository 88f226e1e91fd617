package api_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cella-sandbox/cella/internal/api"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/store"
)

// TestAdminOnlyRoutes: keys, secrets and pool sizes answer an ordinary key
// 403 with the message naming what only the admin key may do.
func TestAdminOnlyRoutes(t *testing.T) {
	e := startLight(t, true, false)
	for _, tc := range []struct{ method, path, msg string }{
		{"GET", "/keys", "only the admin key (<data-dir>/admin.key) may manage API keys"},
		{"POST", "/keys", "only the admin key (<data-dir>/admin.key) may manage API keys"},
		{"DELETE", "/keys/admin", "only the admin key (<data-dir>/admin.key) may manage API keys"},
		{"GET", "/secrets", "only the admin key (<data-dir>/admin.key) may manage secrets"},
		{"POST", "/secrets", "only the admin key (<data-dir>/admin.key) may manage secrets"},
		{"DELETE", "/secrets/X", "only the admin key (<data-dir>/admin.key) may manage secrets"},
		{"PUT", "/pools/base", "only the admin key (<data-dir>/admin.key) may size warm pools"},
		{"GET", "/overview", "only the admin key (<data-dir>/admin.key) may read the daemon's overview"},
	} {
		st, _, body := e.do(t, tc.method, tc.path, e.userKey, map[string]any{"size": 1}, nil)
		var eb struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(body, &eb); err != nil || st != 403 || eb.Code != 403 || eb.Message != tc.msg {
			t.Errorf("%s %s: %d %s; want 403 %q", tc.method, tc.path, st, body, tc.msg)
		}
	}
}

// TestCreateKeyEgress: a key's own egress ceiling is stored with the key:
// the answer, the list and the key itself show it.
func TestCreateKeyEgress(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "cella.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	const adminKey = "e2b_admin_test_key"
	if err := st.AddAPIKey(ctx, store.AdminKeyID, "admin", adminKey); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Config{Store: st, Log: slog.New(slog.DiscardHandler),
		EgressCeiling: &egress.Policy{AllowOut: []string{"pkg.test", "*.github.com"}}}))
	t.Cleanup(srv.Close)
	a := apiT{env: &daemontest.Env{URL: srv.URL, APIKey: adminKey, DataDir: dir}}

	type key struct {
		ID          string   `json:"id"`
		Key         string   `json:"key"`
		EgressAllow []string `json:"egressAllow"`
		Egress      string   `json:"egress"`
	}
	decode := func(body []byte) key {
		t.Helper()
		var k key
		if err := json.Unmarshal(body, &k); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return k
	}
	code, _, body := a.do(t, "POST", "/keys", adminKey, map[string]any{"name": "narrow", "egressAllow": []string{"pkg.test"}}, nil)
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	narrow := decode(body)
	if !slices.Equal(narrow.EgressAllow, []string{"pkg.test"}) || narrow.Key == "" {
		t.Fatalf("created %s", body)
	}
	code, _, body = a.do(t, "POST", "/keys", adminKey, map[string]any{"name": "wide"}, nil)
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	wide := decode(body)
	if wide.EgressAllow == nil || len(wide.EgressAllow) != 0 {
		t.Fatalf("created %s", body)
	}
	code, _, body = a.do(t, "POST", "/keys", adminKey, map[string]any{"name": "outside", "egressAllow": []string{"evil.test"}}, nil)
	a.wantError(t, 403, code, body, "egressAllow")

	code, _, body = a.do(t, "GET", "/keys/self", narrow.Key, nil, nil)
	if self := decode(body); code != 200 || self.ID != narrow.ID || !slices.Equal(self.EgressAllow, []string{"pkg.test"}) || self.Egress != narrow.Egress {
		t.Fatalf("self: %d %s", code, body)
	}
	code, _, body = a.do(t, "GET", "/keys", adminKey, nil, nil)
	var all []key
	if err := json.Unmarshal(body, &all); code != 200 || err != nil || len(all) != 3 {
		t.Fatalf("list: %d %s", code, body)
	}
	for _, k := range all {
		switch k.ID {
		case narrow.ID:
			if !slices.Equal(k.EgressAllow, []string{"pkg.test"}) {
				t.Errorf("narrow key listed as %+v", k)
			}
		case wide.ID, store.AdminKeyID:
			if k.EgressAllow == nil || len(k.EgressAllow) != 0 {
				t.Errorf("key listed as %+v", k)
			}
		default:
			t.Errorf("unexpected key %+v", k)
		}
	}
}
