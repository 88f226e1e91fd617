package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/store"
)

// TestIntParam: the default when absent, else an integer from 1 to max, with
// the message every limit parameter has always given.
func TestIntParam(t *testing.T) {
	for q, want := range map[string]int{"": 100, "limit=": 100, "limit=1": 1, "limit=100": 100, "limit=42&x=1": 42} {
		v, _ := url.ParseQuery(q)
		if n, err := intParam(v, "limit", 100, 100); err != nil || n != want {
			t.Errorf("%q: %d, %v; want %d", q, n, err, want)
		}
	}
	for q, msg := range map[string]string{
		"limit=0":   `limit must be an integer from 1 to 100 (got "0")`,
		"limit=101": `limit must be an integer from 1 to 100 (got "101")`,
		"limit=-1":  `limit must be an integer from 1 to 100 (got "-1")`,
		"limit=x":   `limit must be an integer from 1 to 100 (got "x")`,
		"limit=1.5": `limit must be an integer from 1 to 100 (got "1.5")`,
	} {
		v, _ := url.ParseQuery(q)
		if _, err := intParam(v, "limit", 100, 100); err == nil || err.Error() != msg || !errdefs.Is(err, errdefs.KindInvalidArgument) {
			t.Errorf("%q: %v; want InvalidArgument %q", q, err, msg)
		}
	}
}

// TestNetworkUpdateJSON: the egress fields PUT /sandboxes/{id}/network
// stores are egress.Policy's JSON, byte for byte what the anonymous struct
// it replaced wrote.
func TestNetworkUpdateJSON(t *testing.T) {
	rules := map[string][]egress.Rule{"api.test": {{Transform: &egress.Transform{Headers: map[string]string{"Authorization": "Bearer ${secret:T}"}}}, {}}}
	for _, u := range []networkUpdate{
		{},
		{AllowOut: []string{"pkg.test"}},
		{AllowOut: []string{}, DenyOut: []string{"0.0.0.0/0"}},
		{DenyOut: []string{"*"}, Rules: rules},
		{AllowOut: []string{"a.test", "10.0.0.0/8"}, DenyOut: []string{"b.test"}, Rules: rules, AllowInternetAccess: new(bool)},
	} {
		old, _ := json.Marshal(struct {
			AllowOut []string                 `json:"allowOut,omitempty"`
			DenyOut  []string                 `json:"denyOut,omitempty"`
			Rules    map[string][]egress.Rule `json:"rules,omitempty"`
		}{u.AllowOut, u.DenyOut, u.Rules})
		got, _ := json.Marshal(egress.Policy{AllowOut: u.AllowOut, DenyOut: u.DenyOut, Rules: u.Rules})
		if string(got) != string(old) {
			t.Errorf("%+v: %s, want %s", u, got, old)
		}
	}
}

// TestAdminOnly: any key but the admin key gets 403 naming what it may not
// do; the admin key reaches the handler.
func TestAdminOnly(t *testing.T) {
	s := New(Config{})
	h := s.adminOnly("size warm pools", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	for id, want := range map[string]int{store.AdminKeyID: http.StatusTeapot, "k0123": http.StatusForbidden, "": http.StatusForbidden} {
		rec := httptest.NewRecorder()
		k := store.APIKey{ID: id}
		ctx := context.WithValue(context.WithValue(context.Background(), keyCtx{}, k), principalCtx{}, s.principal(k))
		h(rec, httptest.NewRequest("PUT", "/pools/base", nil).WithContext(ctx))
		if rec.Code != want {
			t.Fatalf("key %q: %d %s, want %d", id, rec.Code, rec.Body, want)
		}
		if want == http.StatusForbidden && rec.Body.String() != `{"code":403,"message":"only the admin key (\u003cdata-dir\u003e/admin.key) may size warm pools"}`+"\n" {
			t.Fatalf("key %q: body %s", id, rec.Body)
		}
	}
}
