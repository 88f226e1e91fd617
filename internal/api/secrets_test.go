package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/api"
	"github.com/cella-sandbox/cella/internal/audit"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/secrets"
	"github.com/cella-sandbox/cella/internal/store"
)

// lightEnv is an API server over a real store, secrets manager and audit
// log but no sandbox manager: enough for the routes that never touch a
// sandbox, and fast.
type lightEnv struct {
	apiT
	dataDir  string
	adminKey string
	userKey  string
	userTeam string
	store    *store.Store
	secrets  *secrets.Manager
	audit    *audit.Log
	logs     *bytes.Buffer
}

func startLight(t *testing.T, withSecrets, withAudit bool) *lightEnv {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "cella.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &lightEnv{dataDir: dir, adminKey: "e2b_admin_test_key", logs: &bytes.Buffer{}, store: st}
	if err := st.AddAPIKey(ctx, store.AdminKeyID, "admin", e.adminKey); err != nil {
		t.Fatal(err)
	}
	user, userKey, err := st.CreateAPIKey(ctx, store.NewKey{Name: "user"})
	if err != nil {
		t.Fatal(err)
	}
	e.userKey, e.userTeam = userKey, user.TeamID
	cfg := api.Config{Store: st, Log: slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if withSecrets {
		box, err := secrets.OpenBox(dir)
		if err != nil {
			t.Fatal(err)
		}
		if e.secrets, err = secrets.NewManager(ctx, st, box); err != nil {
			t.Fatal(err)
		}
		cfg.Secrets = e.secrets
	}
	if withAudit {
		if e.audit, err = audit.New(filepath.Join(dir, "audit"), audit.Options{Redact: e.secrets.Redact}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.audit.Close() })
		cfg.Audit = e.audit
	}
	srv := httptest.NewServer(api.New(cfg))
	t.Cleanup(srv.Close)
	e.apiT = apiT{env: &daemontest.Env{URL: srv.URL, APIKey: e.adminKey, DataDir: dir}}
	return e
}

// secretJSON decodes one E2B Secret and checks that it has exactly E2B's
// fields, no value among them.
func secretJSON(t *testing.T, body []byte) client.Secret {
	t.Helper()
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("not a JSON object: %s", body)
	}
	keys := slices.Sorted(maps.Keys(raw))
	if want := []string{"createdAt", "currentVersion", "metadata", "name", "secretID", "updatedAt"}; !slices.Equal(keys, want) {
		t.Fatalf("fields %v, want %v: %s", keys, want, body)
	}
	var s client.Secret
	if err := json.Unmarshal(body, &s); err != nil || s.Metadata == nil {
		t.Fatalf("secret %s: %v", body, err)
	}
	return s
}

var secretIDRe = regexp.MustCompile(`^sec_[0-9a-z]{20}$`)

func TestSecretsAPI(t *testing.T) {
	e := startLight(t, true, false)
	admin := e.adminKey
	const value = "ghp_TOP-SECRET-VALUE-0123456789"
	var bodies [][]byte // every answer, checked for values at the end
	do := func(method, path string, body any) (int, http.Header, []byte) {
		t.Helper()
		st, h, b := e.do(t, method, path, admin, body, nil)
		bodies = append(bodies, b)
		return st, h, b
	}

	st, _, body := do("POST", "/secrets", map[string]any{"name": "GH_TOKEN", "value": value})
	if st != 201 {
		t.Fatalf("create: %d %s", st, body)
	}
	created := secretJSON(t, body)
	if !secretIDRe.MatchString(created.SecretID) || created.Name != "GH_TOKEN" || created.CurrentVersion != 1 || len(created.Metadata) != 0 ||
		created.CreatedAt.IsZero() || !created.UpdatedAt.Equal(created.CreatedAt) || !bytes.Contains(body, []byte(`"metadata":{}`)) {
		t.Fatalf("create answer: %s", body)
	}

	t.Run("DuplicateIs409", func(t *testing.T) {
		st, _, b := do("POST", "/secrets", map[string]any{"name": "GH_TOKEN", "value": "clobber-attempt"})
		e.wantError(t, 409, st, b, `secret "GH_TOKEN" already exists`)
		if !bytes.Contains(b, []byte("update")) || bytes.Contains(b, []byte("clobber")) {
			t.Fatalf("409 message: %s", b)
		}
		if v, _ := e.secrets.Get("GH_TOKEN"); v != value {
			t.Fatal("a duplicate create changed the value")
		}
	})

	time.Sleep(2 * time.Millisecond)
	st, _, body = do("POST", "/secrets/GH_TOKEN", map[string]any{"value": value + "-v2", "metadata": map[string]string{"owner": "ci"}})
	if st != 200 {
		t.Fatalf("update by name: %d %s", st, body)
	}
	updated := secretJSON(t, body)
	if updated.SecretID != created.SecretID || updated.CurrentVersion != 2 || updated.Metadata["owner"] != "ci" ||
		!updated.CreatedAt.Equal(created.CreatedAt) || !updated.UpdatedAt.After(created.UpdatedAt) {
		t.Fatalf("update answer: %s", body)
	}
	// By ID, without metadata: the metadata stays.
	st, _, body = do("POST", "/secrets/"+created.SecretID, map[string]any{"value": value + "-v3"})
	if s := secretJSON(t, body); st != 200 || s.CurrentVersion != 3 || s.Metadata["owner"] != "ci" {
		t.Fatalf("update by id: %d %s", st, body)
	}
	if v, _ := e.secrets.Get("GH_TOKEN"); v != value+"-v3" {
		t.Fatal("update did not reach the manager")
	}
	for _, ref := range []string{created.SecretID, "GH_TOKEN"} {
		st, _, body = do("GET", "/secrets/"+ref, nil)
		if s := secretJSON(t, body); st != 200 || s.SecretID != created.SecretID || s.Name != "GH_TOKEN" || s.CurrentVersion != 3 {
			t.Fatalf("get %s: %d %s", ref, st, body)
		}
	}

	t.Run("Paging", func(t *testing.T) {
		// GH_TOKEN plus five more: pages of two by name.
		for _, n := range []string{"p-e", "p.c", "p_a", "p-b", "p-d"} {
			if st, _, b := do("POST", "/secrets", map[string]any{"name": n, "value": "paging-value-" + n, "metadata": map[string]string{"n": n}}); st != 201 {
				t.Fatalf("create %s: %d %s", n, st, b)
			}
		}
		var got []string
		tokens := 0
		path := "/secrets?limit=2"
		for {
			st, h, b := do("GET", path, nil)
			if st != 200 {
				t.Fatalf("list %s: %d %s", path, st, b)
			}
			var raw []json.RawMessage
			if err := json.Unmarshal(b, &raw); err != nil || len(raw) == 0 || len(raw) > 2 {
				t.Fatalf("list %s: %s", path, b)
			}
			for _, r := range raw {
				got = append(got, secretJSON(t, r).Name)
			}
			tok := h.Get("X-Next-Token")
			if tok == "" {
				break
			}
			tokens++
			path = "/secrets?limit=2&nextToken=" + url.QueryEscape(tok)
		}
		if want := []string{"GH_TOKEN", "p-b", "p-d", "p-e", "p.c", "p_a"}; !slices.Equal(got, want) || tokens != 2 {
			t.Fatalf("paged list %v with %d tokens, want %v with 2", got, tokens, want)
		}
		// One page of everything (the default limit) and no token.
		st, h, b := do("GET", "/secrets", nil)
		var all []client.Secret
		if json.Unmarshal(b, &all); st != 200 || len(all) != 6 || h.Get("X-Next-Token") != "" {
			t.Fatalf("list: %d %q %s", st, h.Get("X-Next-Token"), b)
		}
		// A cursor names a position, not an item: deleting the last item of
		// a page does not break the next one.
		_, h, _ = do("GET", "/secrets?limit=2", nil)
		if st, _, b := do("DELETE", "/secrets/p-b", nil); st != 204 {
			t.Fatalf("delete p-b: %d %s", st, b)
		}
		st, _, b = do("GET", "/secrets?limit=2&nextToken="+url.QueryEscape(h.Get("X-Next-Token")), nil)
		if json.Unmarshal(b, &all); st != 200 || len(all) != 2 || all[0].Name != "p-d" || all[1].Name != "p-e" {
			t.Fatalf("page after a deleted cursor: %d %s", st, b)
		}
		for _, q := range []string{"limit=0", "limit=101", "limit=x", "nextToken=%25%25", "nextToken="} {
			st, _, b := do("GET", "/secrets?"+q, nil)
			if q == "nextToken=" {
				if st != 200 {
					t.Fatalf("empty nextToken: %d %s", st, b)
				}
				continue
			}
			e.wantError(t, 400, st, b, "")
		}
	})

	t.Run("BadInput", func(t *testing.T) {
		for _, tc := range []struct {
			body     any
			contains string
		}{
			{map[string]any{"name": "", "value": "v"}, "invalid secret name"},
			{map[string]any{"name": "GH TOKEN", "value": "v"}, "letters, digits, '_', '.' and '-'"},
			{map[string]any{"name": "a{b}", "value": "v"}, "letters, digits"},
			{map[string]any{"name": "sec_abc", "value": "v"}, "reserved for secret IDs"},
			{map[string]any{"name": strings.Repeat("A", 129), "value": "v"}, "1-128"},
			{map[string]any{"name": "EMPTY", "value": ""}, "must not be empty"},
			{map[string]any{"name": "EMPTY"}, "must not be empty"},
			{map[string]any{"name": "BIG", "value": strings.Repeat("v", secrets.MaxValueBytes+1)}, "64 KiB"},
			{map[string]any{"name": "NUM", "value": 5}, "value"},
			{map[string]any{"name": "MD", "value": "v", "metadata": map[string]any{"k": 1}}, "metadata"},
			{map[string]any{"name": "MD", "value": "v", "metadata": map[string]string{"k": strings.Repeat("x", 1025)}}, "limit is 1024"},
			{"{not json", "invalid JSON"},
		} {
			st, _, b := do("POST", "/secrets", tc.body)
			e.wantError(t, 400, st, b, tc.contains)
		}
		st, _, b := do("POST", "/secrets/GH_TOKEN", map[string]any{"value": ""})
		e.wantError(t, 400, st, b, "must not be empty")
		st, _, b = do("POST", "/secrets/GH_TOKEN", map[string]any{"value": "v", "metadata": map[string]string{strings.Repeat("k", 129): "v"}})
		e.wantError(t, 400, st, b, "limit is 128")
		if i, _ := e.secrets.Info("GH_TOKEN"); i.Version != 3 {
			t.Fatalf("a refused update changed the version to %d", i.Version)
		}
		for _, r := range [][2]string{{"GET", "/secrets/NOPE"}, {"DELETE", "/secrets/NOPE"}, {"POST", "/secrets/NOPE"}, {"GET", "/secrets/sec_00000000000000000000"}} {
			st, _, b := do(r[0], r[1], map[string]any{"value": "v"})
			e.wantError(t, 404, st, b, strings.TrimPrefix(r[1], "/secrets/"))
		}
		st, _, b = e.do(t, "GET", "/secrets", "", nil, nil)
		e.wantError(t, 401, st, b, "")
	})

	t.Run("NonAdminForbidden", func(t *testing.T) {
		for _, r := range [][2]string{{"POST", "/secrets"}, {"GET", "/secrets"}, {"GET", "/secrets/GH_TOKEN"}, {"POST", "/secrets/GH_TOKEN"}, {"DELETE", "/secrets/GH_TOKEN"}, {"DELETE", "/secrets/" + created.SecretID}} {
			st, _, b := e.do(t, r[0], r[1], e.userKey, map[string]any{"name": "GH_TOKEN", "value": "stolen"}, nil)
			e.wantError(t, 403, st, b, "admin key")
		}
		if v, _ := e.secrets.Get("GH_TOKEN"); v != value+"-v3" {
			t.Fatal("a non-admin key changed a secret")
		}
	})

	st, _, body = do("DELETE", "/secrets/"+created.SecretID, nil)
	if st != 204 || len(body) != 0 {
		t.Fatalf("delete: %d %s", st, body)
	}
	for _, ref := range []string{created.SecretID, "GH_TOKEN"} {
		st, _, body = do("GET", "/secrets/"+ref, nil)
		e.wantError(t, 404, st, body, ref)
	}
	st, _, body = do("DELETE", "/secrets/GH_TOKEN", nil)
	e.wantError(t, 404, st, body, "GH_TOKEN")

	// No answer, nor the database, nor the daemon's log ever holds a value.
	for _, b := range bodies {
		if bytes.Contains(b, []byte("TOP-SECRET")) || bytes.Contains(b, []byte("paging-value")) || bytes.Contains(b, []byte("clobber")) ||
			bytes.Contains(b, []byte("stolen")) || bytes.Contains(b, []byte(`"value"`)) {
			t.Fatalf("an answer carries a value: %s", b)
		}
	}
	checked := 0
	for _, f := range []string{"cella.db", "cella.db-wal"} {
		data, err := os.ReadFile(filepath.Join(e.dataDir, f))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		checked++
		if bytes.Contains(data, []byte("TOP-SECRET")) || bytes.Contains(data, []byte("paging-value")) {
			t.Fatalf("%s holds a plaintext value", f)
		}
	}
	if checked == 0 {
		t.Fatal("no database file to check")
	}
	if strings.Contains(e.logs.String(), "TOP-SECRET") || strings.Contains(e.logs.String(), "paging-value") {
		t.Fatalf("daemon log holds a value: %s", e.logs)
	}
}

func TestSecretsAPINotConfigured(t *testing.T) {
	e := startLight(t, false, false)
	st, _, body := e.do(t, "GET", "/secrets", e.adminKey, nil, nil)
	e.wantError(t, 501, st, body, "not configured")
	st, _, body = e.do(t, "POST", "/secrets", e.adminKey, map[string]any{"name": "A", "value": "b"}, nil)
	e.wantError(t, 501, st, body, "not configured")
	st, _, body = e.do(t, "POST", "/secrets/A", e.adminKey, map[string]any{"value": "b"}, nil)
	e.wantError(t, 501, st, body, "not configured")
}

// The client verbs the CLI uses speak the same API.
func TestSecretsClient(t *testing.T) {
	e := startLight(t, true, false)
	ctx := context.Background()
	c, err := client.New(client.Config{URL: e.env.URL, APIKey: e.adminKey})
	if err != nil {
		t.Fatal(err)
	}
	// set = update, or create on 404.
	s1, err := c.SetSecret(ctx, "TOKEN", "value-1234", nil)
	if err != nil || s1.CurrentVersion != 1 || !secretIDRe.MatchString(s1.SecretID) {
		t.Fatalf("set new: %+v %v", s1, err)
	}
	s2, err := c.SetSecret(ctx, "TOKEN", "value-5678", map[string]string{"k": "v"})
	if err != nil || s2.CurrentVersion != 2 || s2.SecretID != s1.SecretID || s2.Metadata["k"] != "v" {
		t.Fatalf("set existing: %+v %v", s2, err)
	}
	if _, err := c.CreateSecret(ctx, "TOKEN", "x", nil); !client.IsConflict(err) {
		t.Fatalf("create existing: %v", err)
	}
	if _, err := c.UpdateSecret(ctx, "NOPE", "x", nil); !client.IsNotFound(err) {
		t.Fatalf("update missing: %v", err)
	}
	// Secrets follows the pages: more than one page of 100.
	for i := range 150 {
		if _, err := e.secrets.Create(ctx, fmt.Sprintf("S%03d", i), "v-value", nil); err != nil {
			t.Fatal(err)
		}
	}
	ss, err := c.Secrets(ctx)
	if err != nil || len(ss) != 151 || ss[0].Name != "S000" || ss[150].Name != "TOKEN" {
		t.Fatalf("list: %d %v", len(ss), err)
	}
	if s, err := c.GetSecret(ctx, s1.SecretID); err != nil || s.Name != "TOKEN" || s.CurrentVersion != 2 {
		t.Fatalf("get: %v %v", s, err)
	}
	if err := c.DeleteSecret(ctx, "TOKEN"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSecret(ctx, s1.SecretID); !client.IsNotFound(err) {
		t.Fatalf("delete twice: %v", err)
	}
}
