package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/audit"
	"github.com/cella-sandbox/cella/internal/edge"
	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/quota"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/secrets"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
	"github.com/cella-sandbox/cella/internal/volume"
)

// Small fakes of deps.go's interfaces, for the unit tests of the API's own
// logic (routing, auth, parsing, error shapes): no root, no daemon. What
// they keep is only what those tests look at; the real core is tested
// against the real daemon in the other tests of this package.

// fakeSandboxes holds sandboxes in a map and applies the core's one
// tenancy rule (tenant.Principal.Can), as sandbox.Manager does.
type fakeSandboxes struct {
	mu      sync.Mutex
	sbs     map[string]*sandbox.Sandbox
	created []sandbox.Options // what Create was given
	calls   []string          // "Kill id", "SetTimeout id 30s", ...
}

func newFakeSandboxes() *fakeSandboxes { return &fakeSandboxes{sbs: map[string]*sandbox.Sandbox{}} }

// add tracks a sandbox owned by owner.
func (f *fakeSandboxes) add(id string, owner tenant.Owner) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sbs[id] = &sandbox.Sandbox{ID: id, TemplateID: "base", Options: sandbox.Options{TeamID: owner.Team, APIKeyID: owner.Key}}
}

func (f *fakeSandboxes) record(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakeSandboxes) Create(ctx context.Context, p tenant.Principal, opts sandbox.Options) (*sandbox.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	opts.TeamID, opts.APIKeyID = p.Team, p.Key
	f.created = append(f.created, opts)
	sb := &sandbox.Sandbox{ID: fmt.Sprintf("sbx%d", len(f.created)), TemplateID: opts.TemplateID, Options: opts}
	f.sbs[sb.ID] = sb
	return sb, nil
}

func (f *fakeSandboxes) Lookup(p tenant.Principal, id string) (*sandbox.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	if !ok || !p.Can(sb.Options.Owner()) {
		return nil, errdefs.NotFound("sandbox %q not found", id)
	}
	return sb, nil
}

func (f *fakeSandboxes) List(p tenant.Principal) []*sandbox.Sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*sandbox.Sandbox
	for _, sb := range f.sbs {
		if p.Can(sb.Options.Owner()) {
			out = append(out, sb)
		}
	}
	return out
}

// act looks id up as p and records the call.
func (f *fakeSandboxes) act(p tenant.Principal, id, call string) (*sandbox.Sandbox, error) {
	sb, err := f.Lookup(p, id)
	if err == nil {
		f.record("%s %s", call, id)
	}
	return sb, err
}

func (f *fakeSandboxes) Kill(ctx context.Context, p tenant.Principal, id string) error {
	_, err := f.act(p, id, "Kill")
	return err
}
func (f *fakeSandboxes) SetTimeout(ctx context.Context, p tenant.Principal, id string, d time.Duration) error {
	_, err := f.act(p, id, "SetTimeout "+d.String())
	return err
}
func (f *fakeSandboxes) Extend(ctx context.Context, p tenant.Principal, id string, d time.Duration) (*sandbox.Sandbox, error) {
	return f.act(p, id, "Extend "+d.String())
}
func (f *fakeSandboxes) Connect(ctx context.Context, p tenant.Principal, id string, d time.Duration, keepMemory bool) (*sandbox.Sandbox, bool, error) {
	sb, err := f.act(p, id, fmt.Sprintf("Connect %v %v", d, keepMemory))
	return sb, false, err
}
func (f *fakeSandboxes) Pause(ctx context.Context, p tenant.Principal, id string, keepMemory bool) error {
	_, err := f.act(p, id, fmt.Sprintf("Pause %v", keepMemory))
	return err
}
func (f *fakeSandboxes) SetNetwork(ctx context.Context, caller tenant.Principal, id string, p *egress.Policy, network json.RawMessage, allowInternet *bool) error {
	_, err := f.act(caller, id, "SetNetwork")
	return err
}
func (f *fakeSandboxes) LifecycleDefaults() sandbox.Lifecycle { return sandbox.Lifecycle{} }
func (f *fakeSandboxes) Owner(ctx context.Context, id string) (tenant.Owner, error) {
	sb, err := f.Lookup(tenant.System, id)
	if err != nil {
		return tenant.Owner{}, err
	}
	return sb.Options.Owner(), nil
}
func (f *fakeSandboxes) Tracked(id string) bool {
	_, err := f.Lookup(tenant.System, id)
	return err == nil
}
func (f *fakeSandboxes) VolumeUsers(string) []string { return nil }
func (f *fakeSandboxes) Snapshot(ctx context.Context, p tenant.Principal, id, name string) (sandbox.SnapshotInfo, error) {
	_, err := f.act(p, id, "Snapshot")
	return sandbox.SnapshotInfo{}, err
}
func (f *fakeSandboxes) ListSnapshots(context.Context, tenant.Principal, sandbox.SnapshotFilter) ([]sandbox.SnapshotInfo, error) {
	return nil, nil
}
func (f *fakeSandboxes) DeleteSnapshot(ctx context.Context, p tenant.Principal, idOrName string) error {
	return errdefs.NotFound("snapshot %q not found", idOrName)
}
func (f *fakeSandboxes) IsSnapshot(context.Context, tenant.Principal, string) bool { return false }
func (f *fakeSandboxes) SnapshotOrigin(*sandbox.Sandbox) (string, bool)            { return "", false }
func (f *fakeSandboxes) Fork(ctx context.Context, p tenant.Principal, id string, count int, timeout time.Duration) ([]sandbox.ForkResult, error) {
	_, err := f.act(p, id, "Fork")
	return nil, err
}
func (f *fakeSandboxes) Metrics(p tenant.Principal, id string, start, end time.Time, fresh bool) ([]sandbox.Metric, error) {
	_, err := f.Lookup(p, id)
	return nil, err
}
func (f *fakeSandboxes) LatestMetric(p tenant.Principal, id string) (sandbox.Metric, bool, error) {
	_, err := f.Lookup(p, id)
	return sandbox.Metric{}, false, err
}
func (f *fakeSandboxes) TrafficRouter() edge.Router { return noRoutes{} }
func (f *fakeSandboxes) RuntimeName() string        { return "fake" }
func (f *fakeSandboxes) Maxima() sandbox.Maxima     { return sandbox.Maxima{} }
func (f *fakeSandboxes) Usage(key string) (int, float64, int64) {
	n := 0
	for _, sb := range f.List(tenant.System) {
		if sb.Options.APIKeyID == key {
			n++
		}
	}
	return n, 0, 0
}

// noRoutes is a router that knows no sandbox: the edge answers 502.
type noRoutes struct{}

func (noRoutes) Signed(func(string) bool) (string, bool) { return "", false }

func (noRoutes) Route(ctx context.Context, id string, admit func(edge.Sandbox) error) (edge.Sandbox, error) {
	return nil, errdefs.NotFound("sandbox %q not found", id)
}

type fakePools struct{}

func (fakePools) Pools() []sandbox.PoolStatus { return nil }
func (fakePools) SetPool(ctx context.Context, name string, size int) (sandbox.PoolStatus, error) {
	return sandbox.PoolStatus{Template: name, Size: size}, nil
}

// fakeKeys is a key store of plain-text keys.
type fakeKeys struct {
	mu    sync.Mutex
	byKey map[string]store.APIKey
}

func (f *fakeKeys) LookupAPIKey(ctx context.Context, key string) (store.APIKey, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if k, ok := f.byKey[key]; ok {
		return k, nil
	}
	return store.APIKey{}, errdefs.NotFound("no such key")
}
func (f *fakeKeys) CreateAPIKey(ctx context.Context, nk store.NewKey) (store.APIKey, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := store.APIKey{ID: fmt.Sprintf("k%d", len(f.byKey)), Name: nk.Name, TeamID: "team-" + nk.Name, EgressAllow: nk.EgressAllow, Secrets: nk.Secrets}
	secret := "e2b_" + k.ID
	f.byKey[secret] = k
	return k, secret, nil
}
func (f *fakeKeys) ListAPIKeys(context.Context) ([]store.APIKey, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.APIKey
	for _, k := range f.byKey {
		out = append(out, k)
	}
	return out, nil
}
func (f *fakeKeys) DeleteAPIKey(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s, k := range f.byKey {
		if k.ID == id {
			delete(f.byKey, s)
			return nil
		}
	}
	return errdefs.NotFound("key %q not found", id)
}
func (f *fakeKeys) GetAPIKey(ctx context.Context, id string) (store.APIKey, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range f.byKey {
		if k.ID == id {
			return k, nil
		}
	}
	return store.APIKey{}, errdefs.NotFound("key %q not found", id)
}
func (f *fakeKeys) SetKeyLimits(ctx context.Context, id string, l quota.Limits) (store.APIKey, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s, k := range f.byKey {
		if k.ID == id {
			k.Limits = l
			f.byKey[s] = k
			return k, nil
		}
	}
	return store.APIKey{}, errdefs.NotFound("key %q not found", id)
}
func (f *fakeKeys) SandboxOwner(ctx context.Context, id string) (string, string, error) {
	return "", "", errdefs.NotFound("sandbox %q not found", id)
}

type fakeTemplates struct{}

func (fakeTemplates) Get(name string) (*template.Template, error) {
	return nil, errdefs.NotFound("template %q not found", name)
}
func (fakeTemplates) List() ([]*template.Template, error) { return nil, nil }

type fakeVolumes struct{}

func (fakeVolumes) Create(ctx context.Context, owner tenant.Owner, name string, size int64) (volume.Volume, error) {
	return volume.Volume{ID: "vol1", Name: name, SizeBytes: size}, nil
}
func (fakeVolumes) List(context.Context, tenant.Principal) ([]volume.Volume, error) { return nil, nil }
func (fakeVolumes) Get(ctx context.Context, p tenant.Principal, ref string) (volume.Volume, error) {
	return volume.Volume{}, errdefs.NotFound("volume %q not found", ref)
}
func (fakeVolumes) OpenContent(ctx context.Context, id, token string, p *tenant.Principal) (*volume.Content, error) {
	return nil, errdefs.NotFound("volume %q not found", id)
}
func (fakeVolumes) Delete(ctx context.Context, p tenant.Principal, ref string, usedBy func(string) []string) error {
	return errdefs.NotFound("volume %q not found", ref)
}

type fakeSecrets struct{}

func (fakeSecrets) Create(ctx context.Context, name, value string, md map[string]string) (secrets.Info, error) {
	return secrets.Info{Name: name}, nil
}
func (fakeSecrets) Update(ctx context.Context, ref, value string, md map[string]string) (secrets.Info, error) {
	return secrets.Info{}, errdefs.NotFound("secret %q not found", ref)
}
func (fakeSecrets) List() []secrets.Info { return nil }
func (fakeSecrets) Info(ref string) (secrets.Info, error) {
	return secrets.Info{}, errdefs.NotFound("secret %q not found", ref)
}
func (fakeSecrets) Get(name string) (string, error) {
	return "", errdefs.NotFound("secret %q not found", name)
}
func (fakeSecrets) Delete(ctx context.Context, ref string) error {
	return errdefs.NotFound("secret %q not found", ref)
}

type fakeAudit struct{}

func (fakeAudit) Exists(string) bool { return false }
func (fakeAudit) ReadWithStats(string, audit.Query) ([]audit.Entry, audit.Stats, error) {
	return nil, audit.Stats{}, nil
}

// unitAPI is a Server over the fakes, with an admin key and two team keys.
type unitAPI struct {
	t   *testing.T
	srv *Server
	sbs *fakeSandboxes
}

const (
	unitAdminKey = "e2b_unit_admin"
	unitKeyA     = "e2b_unit_team_a"
	unitKeyB     = "e2b_unit_team_b"
)

func newUnitAPI(t *testing.T) *unitAPI {
	sbs := newFakeSandboxes()
	keys := &fakeKeys{byKey: map[string]store.APIKey{
		unitAdminKey: {ID: store.AdminKeyID, Name: "admin"},
		unitKeyA:     {ID: "ka", Name: "a", TeamID: "team-a"},
		unitKeyB:     {ID: "kb", Name: "b", TeamID: "team-b"},
	}}
	srv := New(Config{Manager: sbs, Pools: fakePools{}, Store: keys, Templates: fakeTemplates{},
		Volumes: fakeVolumes{}, Secrets: fakeSecrets{}, Audit: fakeAudit{},
		EgressCeiling: &egress.Policy{AllowOut: []string{"*"}}, Domain: "cella.test",
		Log: slog.New(slog.DiscardHandler)})
	t.Cleanup(srv.Close)
	return &unitAPI{t: t, srv: srv, sbs: sbs}
}

// do serves one request in-process and returns the answer.
func (u *unitAPI) do(method, path, key string, body io.Reader) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, "http://127.0.0.1:3000"+path, body)
	if key != "" {
		r.Header.Set("X-API-Key", key)
	}
	if body != nil {
		r.Header.Set("Content-Type", "application/json")
	}
	w := httptest.NewRecorder()
	u.srv.ServeHTTP(w, r)
	return w
}

func (u *unitAPI) doJSON(method, path, key, body string) *httptest.ResponseRecorder {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	return u.do(method, path, key, rd)
}

// isJSONError reports whether rec is an error answer in the JSON shape
// {code: its status, message}.
func isJSONError(rec *httptest.ResponseRecorder) bool {
	var body errorBody
	return rec.Code >= 400 && strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") &&
		json.Unmarshal(rec.Body.Bytes(), &body) == nil && body.Code == rec.Code && body.Message != ""
}

var _ http.Handler = (*Server)(nil)

// do2 serves a body-less request with the given headers.
func (u *unitAPI) do2(method, path string, hdr map[string]string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, "http://127.0.0.1:3000"+path, nil)
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	u.srv.ServeHTTP(w, r)
	return w
}

// mustKey is the stored key of a plain-text key.
func mustKey(t *testing.T, u *unitAPI, key string) store.APIKey {
	t.Helper()
	k, err := u.srv.cfg.Store.LookupAPIKey(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// errMessage is the message of a JSON error answer.
func errMessage(rec *httptest.ResponseRecorder) string {
	var body errorBody
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	return body.Message
}

// UnitServer is the API over the fakes for the external tests of this
// package (openapi_unit_test.go): its handler, the admin key and a team key.
func UnitServer(t *testing.T) (h http.Handler, adminKey, teamKey string) {
	return newUnitAPI(t).srv, unitAdminKey, unitKeyA
}
