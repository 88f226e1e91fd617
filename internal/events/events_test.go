package events

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/secrets"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// recorder keeps what the service writes to audit logs.
type recorder struct {
	mu   sync.Mutex
	msgs map[string][]string
}

func (r *recorder) Lifecycle(id, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.msgs == nil {
		r.msgs = map[string][]string{}
	}
	r.msgs[id] = append(r.msgs[id], msg)
}

func (r *recorder) of(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs[id]...)
}

func newService(t *testing.T, cfg Config) (*Service, *recorder) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "cella.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rec := &recorder{}
	box, err := secrets.NewBox(make([]byte, secrets.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store, cfg.Audit, cfg.Box = st, rec, box
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, rec
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ptr[T any](v T) *T { return &v }

// TestSign: E2B's documented scheme, unpadded base64 of SHA-256 over the
// secret followed by the raw body (the vector computed with Python's
// hashlib).
func TestSign(t *testing.T) {
	got := Sign("my-secret", []byte(`{"type":"sandbox.lifecycle.created"}`))
	if want := "VwO/HKc0lchAlKvp1qEwp7rM8DA2A5kuz1VtVunoXsY"; got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
}

// TestWebhookDestinations: where a tenant's webhook URL may point. None by
// default; an address entry allows exactly its addresses; a name entry
// allows the name's public addresses only, checked at connect time, so a
// name that resolves (or is re-pointed) to loopback, a private network or
// the metadata service is never dialed; and redirects are not followed.
func TestWebhookDestinations(t *testing.T) {
	ctx := context.Background()
	p := tenant.Principal{Key: "k", Team: "red"}
	in := func(u string) WebhookInput {
		return WebhookInput{Name: ptr("h"), URL: ptr(u), Events: []string{sandbox.EventCreated}, Secret: ptr("s3cret-s3cret")}
	}

	off, _ := newService(t, Config{})
	if _, err := off.CreateWebhook(ctx, p, in("http://127.0.0.1:1/")); !errdefs.Is(err, errdefs.KindForbidden) || !strings.Contains(err.Error(), "--webhook-allow") {
		t.Fatalf("a webhook on a daemon with no --webhook-allow: %v", err)
	}

	names := map[string][]netip.Addr{
		"rebind.test": {netip.MustParseAddr("127.0.0.2")}, // 127.0.0.1 alone is listed
		"meta.test":   {netip.MustParseAddr("169.254.169.254")},
		"lan.test":    {netip.MustParseAddr("10.1.2.3")},
		"public.test": {netip.MustParseAddr("93.184.216.34")},
	}
	resolve := func(_ context.Context, host string) ([]netip.Addr, error) {
		if a, ok := names[host]; ok {
			return a, nil
		}
		return nil, fmt.Errorf("no such host %s", host)
	}
	s, _ := newService(t, Config{Allow: []string{"127.0.0.1", "rebind.test", "meta.test", "lan.test", "public.test"}, Resolve: resolve, Backoff: []time.Duration{}})
	for _, c := range []struct {
		url  string
		kind errdefs.Kind // 0: allowed
	}{
		{"http://127.0.0.1:8080/hook", 0},
		{"https://public.test/hook", 0},
		{"http://rebind.test/", 0}, // allowed by name; its address is refused at dial (below)
		{"http://127.0.0.2/", errdefs.KindForbidden},
		{"http://[::1]/", errdefs.KindForbidden},
		{"http://169.254.169.254/latest/meta-data/", errdefs.KindForbidden},
		{"http://10.1.2.3/", errdefs.KindForbidden},
		{"http://other.test/", errdefs.KindForbidden},
		{"http://localhost/", errdefs.KindForbidden}, // not resolvable here, not listed
		{"ftp://127.0.0.1/", errdefs.KindInvalidArgument},
		{"/relative", errdefs.KindInvalidArgument},
		{"http://user:pw@127.0.0.1/", errdefs.KindInvalidArgument},
	} {
		err := s.CheckURL(c.url)
		if c.kind == 0 && err != nil || c.kind != 0 && !errdefs.Is(err, c.kind) {
			t.Errorf("CheckURL(%s) = %v, want kind %v", c.url, err, c.kind)
		}
	}
	for _, host := range []string{"rebind.test", "meta.test", "lan.test"} {
		if _, err := s.dial(ctx, "tcp", host+":80"); err == nil || !strings.Contains(err.Error(), "not an allowed webhook destination") {
			t.Errorf("dial %s (a name entry resolving to a non-public address): %v", host, err)
		}
	}

	// A redirect from an allowed receiver is not followed.
	hit := make(chan struct{}, 1)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hit <- struct{}{} }))
	defer other.Close()
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/stolen", http.StatusTemporaryRedirect)
	}))
	defer redirect.Close()
	res, ok := s.post("wh", redirect.URL, "x", "d", []byte("{}"))
	if ok || !strings.Contains(res, "307") {
		t.Fatalf("a redirecting receiver: %s %v", res, ok)
	}
	select {
	case <-hit:
		t.Fatal("the redirect was followed")
	default:
	}
}

// TestDelivery: an event reaches the team's subscribed webhooks only,
// signed as E2B signs it, retried after failures with a new delivery ID
// each time, and every attempt is in the sandbox's audit log; the events
// API shows the event to its team only.
func TestDelivery(t *testing.T) {
	ctx := context.Background()
	type got struct {
		hdr  http.Header
		body []byte
	}
	var mu sync.Mutex
	var hits []got
	fails := 2
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		hits = append(hits, got{r.Header.Clone(), b})
		if fails > 0 {
			fails--
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer recv.Close()
	otherHits := 0
	otherRecv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		otherHits++
		mu.Unlock()
	}))
	defer otherRecv.Close()

	s, rec := newService(t, Config{Allow: []string{"127.0.0.1"}, Backoff: []time.Duration{time.Millisecond, time.Millisecond, time.Millisecond}})
	red := tenant.Principal{Key: "kr", Team: "red"}
	blue := tenant.Principal{Key: "kb", Team: "blue"}
	wh, err := s.CreateWebhook(ctx, red, WebhookInput{Name: ptr("red hook"), URL: ptr(recv.URL + "/hook"),
		Events: []string{sandbox.EventCreated, sandbox.EventKilled}, Secret: ptr("red-secret-123")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateWebhook(ctx, red, WebhookInput{Name: ptr("paused only"), URL: ptr(otherRecv.URL),
		Events: []string{sandbox.EventPaused}, Secret: ptr("red-secret-456")}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateWebhook(ctx, blue, WebhookInput{Name: ptr("blue hook"), URL: ptr(otherRecv.URL),
		Events: sandbox.EventTypes, Secret: ptr("blue-secret-789")}); err != nil {
		t.Fatal(err)
	}
	stored, err := s.cfg.Store.ListWebhooks(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(stored); strings.Contains(string(b), "red-secret-123") || strings.Contains(string(b), "blue-secret") {
		t.Fatalf("a signing secret is stored in the clear: %s", b)
	}
	if _, err := s.Webhook(ctx, blue, wh.ID); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("blue reads red's webhook: %v", err)
	}
	if err := s.DeleteWebhook(ctx, blue, wh.ID); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("blue deletes red's webhook: %v", err)
	}
	if _, err := s.UpdateWebhook(ctx, blue, wh.ID, WebhookInput{URL: ptr(otherRecv.URL)}); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("blue updates red's webhook: %v", err)
	}

	s.SandboxEvent(sandbox.LifecycleEvent{Type: sandbox.EventCreated, Time: time.Now(), SandboxID: "sbxred", TemplateID: "base",
		Owner: tenant.Owner{Team: "red", Key: "kr"}, Metadata: map[string]string{"app": "x"}})
	waitFor(t, "three attempts (two failures, then a success)", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(hits) >= 3
	})
	mu.Lock()
	ids := map[string]bool{}
	for i, h := range hits {
		if sig := h.hdr.Get("e2b-signature"); sig != Sign("red-secret-123", h.body) {
			t.Errorf("attempt %d: e2b-signature %q does not verify", i, sig)
		}
		if h.hdr.Get("e2b-webhook-id") != wh.ID || h.hdr.Get("e2b-signature-version") != "v1" || h.hdr.Get("Content-Type") != "application/json" {
			t.Errorf("attempt %d headers: %v", i, h.hdr)
		}
		ids[h.hdr.Get("e2b-delivery-id")] = true
	}
	var ev Event
	if err := json.Unmarshal(hits[0].body, &ev); err != nil {
		t.Fatal(err)
	}
	mu.Unlock()
	if len(ids) != 3 {
		t.Errorf("delivery IDs: %v, want one per attempt", ids)
	}
	if ev.Type != sandbox.EventCreated || ev.Version != "v2" || ev.EventLabel != "create" || ev.EventCategory != "lifecycle" ||
		ev.SandboxID != "sbxred" || ev.SandboxTeamID != "red" || ev.SandboxTemplateID != "base" {
		t.Errorf("event: %+v", ev)
	}
	if md, _ := ev.EventData["sandbox_metadata"].(map[string]any); md["app"] != "x" {
		t.Errorf("event_data: %v", ev.EventData)
	}
	waitFor(t, "the three attempts in the audit log", func() bool { return len(rec.of("sbxred")) >= 3 })
	for i, m := range rec.of("sbxred") {
		if !strings.Contains(m, wh.ID) || !strings.Contains(m, fmt.Sprintf("attempt %d of 4", i+1)) {
			t.Errorf("audit %d: %s", i, m)
		}
	}
	mu.Lock()
	if otherHits != 0 {
		t.Errorf("blue's webhook or the paused-only one got red's created event (%d)", otherHits)
	}
	mu.Unlock()
	red1, err := s.SandboxEvents(ctx, red, "sbxred", 0, 10, false)
	if err != nil || len(red1) != 1 {
		t.Fatalf("red's events: %s %v", red1, err)
	}
	if b, err := s.SandboxEvents(ctx, blue, "sbxred", 0, 10, false); err != nil || len(b) != 0 {
		t.Fatalf("blue sees red's events: %s %v", b, err)
	}

	// Disabled: no more deliveries (and a pending retry stops).
	if _, err := s.UpdateWebhook(ctx, red, wh.ID, WebhookInput{Enabled: ptr(false)}); err != nil {
		t.Fatal(err)
	}
	s.SandboxEvent(sandbox.LifecycleEvent{Type: sandbox.EventKilled, Time: time.Now(), SandboxID: "sbxred", Owner: tenant.Owner{Team: "red"}})
	waitFor(t, "the killed event stored", func() bool {
		evs, _ := s.SandboxEvents(ctx, red, "sbxred", 0, 10, true)
		return len(evs) == 2
	})
	mu.Lock()
	n := len(hits)
	mu.Unlock()
	if n != 3 {
		t.Errorf("a disabled webhook got a delivery (%d attempts)", n)
	}
}

// TestNeverBlocks: with the receiver stuck and the queues full, emitting
// events returns at once (a lifecycle operation is never held up), and
// what was dropped is said in the audit log.
func TestNeverBlocks(t *testing.T) {
	release := make(chan struct{})
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer recv.Close()
	defer close(release)
	s, rec := newService(t, Config{Allow: []string{"127.0.0.1"}, QueueSize: 2, Workers: 1, Timeout: time.Hour})
	p := tenant.Principal{Key: "k", Team: "red"}
	if _, err := s.CreateWebhook(context.Background(), p, WebhookInput{Name: ptr("stuck"), URL: ptr(recv.URL),
		Events: sandbox.EventTypes, Secret: ptr("secret-secret")}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 500 {
			s.SandboxEvent(sandbox.LifecycleEvent{Type: sandbox.EventUpdated, Time: time.Now(), SandboxID: "sbx", Owner: tenant.Owner{Team: "red"}, Detail: fmt.Sprint(i)})
		}
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("SandboxEvent blocked behind a stuck webhook")
	}
	waitFor(t, "a dropped event or delivery in the audit log", func() bool {
		for _, m := range rec.of("sbx") {
			if strings.Contains(m, "queue") && strings.Contains(m, "is full") {
				return true
			}
		}
		return false
	})
}
