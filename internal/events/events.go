// Package events keeps sandbox lifecycle events and delivers them to
// webhooks: E2B's events API (GET /events/sandboxes/{id}) and its
// /events/webhooks, with E2B's event shape and e2b-signature scheme.
//
// The sandbox manager hands every lifecycle change to SandboxEvent, which
// only queues it (a bounded queue: a lifecycle operation never waits for
// the store or a webhook; an event that finds the queue full is dropped,
// logged and noted in the sandbox's audit log). One dispatcher stores the
// events in order and fans each out to the enabled webhooks of the
// sandbox's team that subscribe to its type; a few workers post them,
// retrying failed deliveries with backoff. Every attempt is written to the
// sandbox's audit log.
//
// A webhook URL is chosen by a tenant and dialed by the daemon, so it is
// an SSRF vector: the daemon posts only to destinations the operator
// listed (--webhook-allow: the egress entry syntax; none by default, so
// webhooks are off until an operator says where they may go). The URL's
// host must be listed when it is set (an IP by an address entry, a name by
// a name entry; names are not resolved then), and every address the
// daemon dials is checked again at connect time: an address entry allows
// that address, whatever name led to it; a name entry allows the name's
// public addresses only (never loopback, private, link-local or metadata
// ones, which need an address entry too). Redirects are not followed and
// no proxy is used.
package events

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/secrets"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// Defaults of Config.
const (
	DefaultQueueSize = 4096
	DefaultWorkers   = 4
	DefaultTimeout   = 10 * time.Second
	DefaultRetention = 7 * 24 * time.Hour
	// MaxWebhooksPerTeam bounds a team's webhooks.
	MaxWebhooksPerTeam = 20
)

// DefaultBackoff is E2B's: a failed delivery is retried 3 times, 10 s apart.
var DefaultBackoff = []time.Duration{10 * time.Second, 10 * time.Second, 10 * time.Second}

// Recorder writes to a sandbox's audit log.
type Recorder interface {
	Lifecycle(sandboxID, message string)
}

// Webhooks keeps the webhooks (a node's store; a cluster's are in the
// Kubernetes API, cluster.WebhookRecords, so every node delivers every
// team's events to them).
type Webhooks interface {
	PutWebhook(ctx context.Context, w store.Webhook) error
	GetWebhook(ctx context.Context, team, id string) (store.Webhook, error)
	ListWebhooks(ctx context.Context, team string) ([]store.Webhook, error)
	DeleteWebhook(ctx context.Context, team, id string) error
}

// Config configures a Service.
type Config struct {
	Store *store.Store
	// Webhooks keeps the webhooks (nil: Store).
	Webhooks Webhooks
	// Box seals the webhooks' signing secrets in the store.
	Box   *secrets.Box
	Audit Recorder // nil: deliveries are not recorded
	Log   *slog.Logger
	// Allow is where webhooks may post (egress entries: names,
	// *.wildcards, IPs, CIDRs). Empty: nowhere, webhooks are refused.
	Allow []string
	// Backoff is the wait before each retry (nil: DefaultBackoff; empty
	// slice: no retries).
	Backoff   []time.Duration
	QueueSize int
	Workers   int
	Timeout   time.Duration // per attempt
	Retention time.Duration // stored events older than this are pruned
	// Resolve looks up a webhook host (nil: the system resolver).
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
}

// Service stores lifecycle events and delivers them to webhooks.
type Service struct {
	cfg    Config
	log    *slog.Logger
	allow  egress.Policy
	client *http.Client

	events     chan sandbox.LifecycleEvent
	deliveries chan *delivery
	stop       chan struct{}
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	closeOnce  sync.Once
}

// delivery is one event on its way to one webhook.
type delivery struct {
	webhookID string
	teamID    string
	sandboxID string
	eventType string
	body      []byte
	attempt   int // attempts made so far
}

// New validates cfg and starts the dispatcher and the workers.
func New(cfg Config) (*Service, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Webhooks == nil {
		cfg.Webhooks = cfg.Store
	}
	if cfg.Box == nil {
		return nil, errors.New("events: no box to seal webhook secrets")
	}
	if cfg.Backoff == nil {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.Resolve == nil {
		cfg.Resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	allow := egress.Policy{AllowOut: cfg.Allow}
	if err := allow.Validate(); err != nil {
		return nil, fmt.Errorf("webhook-allow: %w", err)
	}
	s := &Service{cfg: cfg, log: cfg.Log, allow: allow,
		events:     make(chan sandbox.LifecycleEvent, cfg.QueueSize),
		deliveries: make(chan *delivery, cfg.QueueSize),
		stop:       make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.client = &http.Client{
		Timeout: cfg.Timeout,
		Transport: &http.Transport{
			Proxy:               nil, // the daemon's environment never redirects a tenant's URL
			DialContext:         s.dial,
			ForceAttemptHTTP2:   true,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     30 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	s.wg.Add(1 + cfg.Workers)
	go s.dispatch()
	for range cfg.Workers {
		go s.work()
	}
	return s, nil
}

// Close stops the service; queued events and deliveries are dropped.
func (s *Service) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		s.cancel()
		s.wg.Wait()
		s.client.CloseIdleConnections()
	})
	return nil
}

// SandboxEvent queues a lifecycle event (sandbox.EventSink). It never
// blocks: a full queue drops the event, and says so.
func (s *Service) SandboxEvent(ev sandbox.LifecycleEvent) {
	select {
	case <-s.stop:
		return
	default:
	}
	select {
	case s.events <- ev:
	default:
		s.log.Warn("lifecycle event dropped: the event queue is full", "sandbox", ev.SandboxID, "type", ev.Type, "queue", s.cfg.QueueSize)
		s.record(ev.SandboxID, "lifecycle event %s not stored or delivered to webhooks: the daemon's event queue (%d) is full", ev.Type, s.cfg.QueueSize)
	}
}

func (s *Service) record(sandboxID, format string, args ...any) {
	if s.cfg.Audit != nil {
		s.cfg.Audit.Lifecycle(sandboxID, fmt.Sprintf(format, args...))
	}
}

// Event is E2B's SandboxEvent (version v2, with the v1 category/label).
type Event struct {
	ID                 string         `json:"id"`
	Version            string         `json:"version"`
	Type               string         `json:"type"`
	EventCategory      string         `json:"event_category"`
	EventLabel         string         `json:"event_label"`
	EventData          map[string]any `json:"event_data,omitempty"`
	Timestamp          time.Time      `json:"timestamp"`
	SandboxID          string         `json:"sandbox_id"`
	SandboxExecutionID string         `json:"sandbox_execution_id"`
	SandboxTemplateID  string         `json:"sandbox_template_id"`
	SandboxBuildID     string         `json:"sandbox_build_id"`
	SandboxTeamID      string         `json:"sandbox_team_id"`
}

// labels are E2B's v1 event labels of the v2 types.
var labels = map[string]string{
	sandbox.EventCreated: "create", sandbox.EventKilled: "kill", sandbox.EventPaused: "pause",
	sandbox.EventResumed: "resume", sandbox.EventUpdated: "update",
}

// eventOf is the E2B event of a lifecycle change.
func eventOf(ev sandbox.LifecycleEvent) Event {
	data := map[string]any{}
	if len(ev.Metadata) > 0 {
		data["sandbox_metadata"] = ev.Metadata
	}
	if x := ev.Execution; x != nil {
		data["execution"] = map[string]any{
			"started_at":     x.StartedAt.UTC().Format(time.RFC3339),
			"vcpu_count":     x.CPUs,
			"memory_mb":      x.MemoryMB,
			"execution_time": x.Duration.Milliseconds(),
		}
	}
	if ev.Detail != "" {
		data["cella_detail"] = ev.Detail
	}
	if len(data) == 0 {
		data = nil
	}
	return Event{ID: uuid.NewString(), Version: "v2", Type: ev.Type, EventCategory: "lifecycle", EventLabel: labels[ev.Type],
		EventData: data, Timestamp: ev.Time.UTC(), SandboxID: ev.SandboxID, SandboxTemplateID: ev.TemplateID,
		SandboxTeamID: ev.Owner.Team}
}

// dispatch stores each event and queues its deliveries, in order.
func (s *Service) dispatch() {
	defer s.wg.Done()
	prune := time.NewTicker(time.Hour)
	defer prune.Stop()
	s.prune()
	for {
		select {
		case <-s.stop:
			return
		case <-prune.C:
			s.prune()
		case ev := <-s.events:
			s.handle(ev)
		}
	}
}

func (s *Service) prune() {
	if n, err := s.cfg.Store.PruneSandboxEvents(s.ctx, time.Now().Add(-s.cfg.Retention)); err != nil {
		s.log.Warn("prune lifecycle events", "err", err)
	} else if n > 0 {
		s.log.Info("pruned lifecycle events", "count", n, "retention", s.cfg.Retention)
	}
}

func (s *Service) handle(lev sandbox.LifecycleEvent) {
	ev := eventOf(lev)
	body, err := json.Marshal(ev)
	if err != nil {
		s.log.Error("encode lifecycle event", "err", err)
		return
	}
	if err := s.cfg.Store.PutSandboxEvent(s.ctx, store.SandboxEvent{ID: ev.ID, SandboxID: ev.SandboxID, TeamID: ev.SandboxTeamID,
		At: ev.Timestamp, Record: body}); err != nil {
		s.log.Error("store lifecycle event", "sandbox", ev.SandboxID, "err", err)
	}
	hooks, err := s.cfg.Webhooks.ListWebhooks(s.ctx, ev.SandboxTeamID)
	if err != nil {
		s.log.Error("list webhooks", "team", ev.SandboxTeamID, "err", err)
		return
	}
	for _, w := range hooks {
		if !w.Enabled || !slices.Contains(w.Events, ev.Type) {
			continue
		}
		s.enqueue(&delivery{webhookID: w.ID, teamID: w.TeamID, sandboxID: ev.SandboxID, eventType: ev.Type, body: body})
	}
}

// enqueue queues a delivery without waiting; a full queue drops it.
func (s *Service) enqueue(d *delivery) {
	select {
	case <-s.stop:
	case s.deliveries <- d:
	default:
		s.log.Warn("webhook delivery dropped: the delivery queue is full", "webhook", d.webhookID, "sandbox", d.sandboxID, "type", d.eventType)
		s.record(d.sandboxID, "webhook %s: %s not delivered: the daemon's delivery queue (%d) is full", d.webhookID, d.eventType, s.cfg.QueueSize)
	}
}

func (s *Service) work() {
	defer s.wg.Done()
	for {
		select {
		case <-s.stop:
			return
		case d := <-s.deliveries:
			s.attempt(d)
		}
	}
}

// Sign is E2B's e2b-signature of body: SHA-256 of the secret followed by
// the body, base64 without padding.
func Sign(secret string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(secret))
	h.Write(body)
	return base64.RawStdEncoding.EncodeToString(h.Sum(nil))
}

// attempt posts d once and schedules a retry if it failed and retries
// remain. The webhook is read again each time: a deleted or disabled one
// gets no more attempts.
func (s *Service) attempt(d *delivery) {
	w, err := s.cfg.Webhooks.GetWebhook(s.ctx, d.teamID, d.webhookID)
	if err != nil || !w.Enabled {
		return
	}
	d.attempt++
	total := len(s.cfg.Backoff) + 1
	deliveryID := uuid.NewString()
	secret, err := s.cfg.Box.Open(secretName(w.ID), w.SealedSecret)
	if err != nil {
		s.log.Error("open webhook secret", "webhook", w.ID, "err", err)
		s.record(d.sandboxID, "webhook %s (%s): %s not delivered: its signing secret does not open under this daemon's master key", w.ID, w.Name, d.eventType)
		return
	}
	result, ok := s.post(w.ID, w.URL, string(secret), deliveryID, d.body)
	s.record(d.sandboxID, "webhook %s (%s): %s to %s: %s (attempt %d of %d, delivery %s)",
		w.ID, w.Name, d.eventType, redactURL(w.URL), result, d.attempt, total, deliveryID)
	if ok || d.attempt >= total {
		if !ok {
			s.log.Warn("webhook delivery failed", "webhook", w.ID, "sandbox", d.sandboxID, "type", d.eventType, "result", result, "attempts", d.attempt)
		}
		return
	}
	wait := s.cfg.Backoff[d.attempt-1]
	time.AfterFunc(wait, func() { s.enqueue(d) })
}

// post sends one attempt: a short description of the outcome, and
// whether it was a 2xx.
func (s *Service) post(webhookID, url, secret, deliveryID string, body []byte) (string, bool) {
	req, err := http.NewRequestWithContext(s.ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return "invalid URL: " + err.Error(), false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "cella-webhooks")
	req.Header.Set("e2b-webhook-id", webhookID)
	req.Header.Set("e2b-delivery-id", deliveryID)
	req.Header.Set("e2b-signature-version", "v1")
	req.Header.Set("e2b-signature", Sign(secret, body))
	resp, err := s.client.Do(req)
	if err != nil {
		return "failed: " + err.Error(), false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.Status, resp.StatusCode >= 200 && resp.StatusCode < 300
}

// redactURL drops a URL's query and user info for the log.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(invalid URL)"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

// errNotAllowed explains a refused destination.
func (s *Service) errNotAllowed(what string) error {
	if len(s.cfg.Allow) == 0 {
		return errdefs.Forbidden("webhooks are off on this daemon: it posts to no destination until an operator lists them with cella serve --webhook-allow HOST|IP|CIDR (refused: %s)", what)
	}
	return errdefs.Forbidden("webhook destination %s is not allowed: the daemon posts only to %s; an operator can add it with cella serve --webhook-allow HOST|IP|CIDR", what, strings.Join(s.cfg.Allow, ", "))
}

// publicAddr reports whether a is an ordinary internet address: what a
// name entry may resolve to.
func publicAddr(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsGlobalUnicast() && !a.IsPrivate() && !a.IsLoopback() && !a.IsLinkLocalUnicast() &&
		!netip.MustParsePrefix("100.64.0.0/10").Contains(a) && !netip.MustParsePrefix("198.18.0.0/15").Contains(a)
}

// addrAllowed says whether the daemon may post to a, reached as host.
func (s *Service) addrAllowed(host string, a netip.Addr) bool {
	if ok, _ := s.allow.AllowsAddr(a.Unmap()); ok {
		return true
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return false // an IP literal needs an address entry
	}
	ok, _ := s.allow.AllowsHost(host)
	return ok && publicAddr(a)
}

// dial connects to an allowed address of addr's host only.
func (s *Service) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	addrs, err := s.lookup(ctx, host)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	var errs []error
	for _, a := range addrs {
		if !s.addrAllowed(host, a) {
			errs = append(errs, fmt.Errorf("%s (%s) is not an allowed webhook destination", a, host))
			continue
		}
		c, err := d.DialContext(ctx, network, net.JoinHostPort(a.String(), port))
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func (s *Service) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	addrs, err := s.cfg.Resolve(ctx, host)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", host, err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("resolve %s: no addresses", host)
	}
	return addrs, nil
}

// CheckURL validates a webhook URL: absolute http(s), no user info, and a
// host the daemon may post to: an IP an address entry allows, or a name a
// name entry allows.
func (s *Service) CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" {
		return errdefs.InvalidArgument("webhook url %q: give an absolute http:// or https:// URL", raw)
	}
	if u.User != nil {
		return errdefs.InvalidArgument("webhook url: credentials in the URL are refused (they would be logged); the e2b-signature header authenticates deliveries")
	}
	host := u.Hostname()
	if a, err := netip.ParseAddr(host); err == nil {
		if !s.addrAllowed(host, a) {
			return s.errNotAllowed(host)
		}
		return nil
	}
	// A name must be listed itself: it is not resolved here (what it
	// resolves to is checked at every connect).
	if ok, _ := s.allow.AllowsHost(host); ok {
		return nil
	}
	return s.errNotAllowed(host)
}

// WebhookInput is a create or an update: nil fields are not given.
type WebhookInput struct {
	Name    *string
	URL     *string
	Events  []string
	Enabled *bool
	Secret  *string
}

func validEvents(evs []string) error {
	if len(evs) == 0 {
		return errdefs.InvalidArgument("events: give at least one of %s", strings.Join(sandbox.EventTypes, ", "))
	}
	for _, e := range evs {
		if !slices.Contains(sandbox.EventTypes, e) {
			return errdefs.InvalidArgument("events: %q is not an event type (use %s)", e, strings.Join(sandbox.EventTypes, ", "))
		}
	}
	return nil
}

func (s *Service) apply(ctx context.Context, w *store.Webhook, in WebhookInput) error {
	if in.Name != nil {
		if n := strings.TrimSpace(*in.Name); n == "" || len(n) > 200 {
			return errdefs.InvalidArgument("name: give 1-200 characters")
		}
		w.Name = strings.TrimSpace(*in.Name)
	}
	if in.URL != nil {
		if len(*in.URL) > 2048 {
			return errdefs.InvalidArgument("url: at most 2048 characters")
		}
		if err := s.CheckURL(*in.URL); err != nil {
			return err
		}
		w.URL = *in.URL
	}
	if in.Events != nil {
		if err := validEvents(in.Events); err != nil {
			return err
		}
		w.Events = slices.Compact(slices.Sorted(slices.Values(in.Events)))
	}
	if in.Enabled != nil {
		w.Enabled = *in.Enabled
	}
	if in.Secret != nil {
		if len(*in.Secret) < 8 || len(*in.Secret) > 512 {
			return errdefs.InvalidArgument("signatureSecret: give 8-512 characters")
		}
		sealed, err := s.cfg.Box.Seal(secretName(w.ID), []byte(*in.Secret))
		if err != nil {
			return fmt.Errorf("seal webhook secret: %w", err)
		}
		w.SealedSecret = sealed
	}
	return nil
}

// secretName binds a sealed signing secret to its webhook (no secret's
// name has a '/').
func secretName(webhookID string) string { return "webhook/" + webhookID }

// CreateWebhook registers a webhook for p's team.
func (s *Service) CreateWebhook(ctx context.Context, p tenant.Principal, in WebhookInput) (store.Webhook, error) {
	switch {
	case in.Name == nil:
		return store.Webhook{}, errdefs.InvalidArgument("name is required")
	case in.URL == nil:
		return store.Webhook{}, errdefs.InvalidArgument("url is required")
	case in.Events == nil:
		return store.Webhook{}, errdefs.InvalidArgument("events is required (e.g. [%q])", sandbox.EventCreated)
	case in.Secret == nil:
		return store.Webhook{}, errdefs.InvalidArgument("signatureSecret is required: deliveries are signed with it (e2b-signature)")
	}
	if len(s.cfg.Allow) == 0 {
		return store.Webhook{}, s.errNotAllowed(*in.URL)
	}
	have, err := s.cfg.Webhooks.ListWebhooks(ctx, p.Team)
	if err != nil {
		return store.Webhook{}, err
	}
	if len(have) >= MaxWebhooksPerTeam {
		return store.Webhook{}, errdefs.ResourceExhausted("team %s has %d webhooks, the most a team may have: delete one first", p.Team, MaxWebhooksPerTeam)
	}
	b := make([]byte, 10)
	if _, err := rand.Read(b); err != nil {
		return store.Webhook{}, fmt.Errorf("generate webhook id: %w", err)
	}
	w := store.Webhook{ID: "wh_" + hex.EncodeToString(b), TeamID: p.Team, Enabled: true, CreatedAt: time.Now().UTC()}
	if err := s.apply(ctx, &w, in); err != nil {
		return store.Webhook{}, err
	}
	if err := s.cfg.Webhooks.PutWebhook(ctx, w); err != nil {
		return store.Webhook{}, err
	}
	return w, nil
}

// scope is the team whose webhooks p sees ("": the admin's, every team's).
func scope(p tenant.Principal) string {
	if p.Admin {
		return ""
	}
	return p.Team
}

func notFound(id string) error { return errdefs.NotFound("webhook %q not found", id) }

// Webhook returns a webhook p may see.
func (s *Service) Webhook(ctx context.Context, p tenant.Principal, id string) (store.Webhook, error) {
	w, err := s.cfg.Webhooks.GetWebhook(ctx, scope(p), id)
	if errors.Is(err, store.ErrNotFound) {
		return w, notFound(id)
	}
	return w, err
}

// Webhooks lists the webhooks p may see.
func (s *Service) Webhooks(ctx context.Context, p tenant.Principal) ([]store.Webhook, error) {
	return s.cfg.Webhooks.ListWebhooks(ctx, scope(p))
}

// UpdateWebhook changes the fields in gives.
func (s *Service) UpdateWebhook(ctx context.Context, p tenant.Principal, id string, in WebhookInput) (store.Webhook, error) {
	w, err := s.Webhook(ctx, p, id)
	if err != nil {
		return w, err
	}
	if err := s.apply(ctx, &w, in); err != nil {
		return store.Webhook{}, err
	}
	return w, s.cfg.Webhooks.PutWebhook(ctx, w)
}

// DeleteWebhook removes a webhook; its pending retries stop.
func (s *Service) DeleteWebhook(ctx context.Context, p tenant.Principal, id string) error {
	err := s.cfg.Webhooks.DeleteWebhook(ctx, scope(p), id)
	if errors.Is(err, store.ErrNotFound) {
		return notFound(id)
	}
	return err
}

// SandboxEvents returns the stored events of a sandbox that p may see
// (another team's sandbox has none; sandboxID "": every sandbox p may
// see), newest first unless ascending.
func (s *Service) SandboxEvents(ctx context.Context, p tenant.Principal, sandboxID string, offset, limit int, ascending bool) ([]json.RawMessage, error) {
	return s.cfg.Store.SandboxEvents(ctx, store.EventQuery{SandboxID: sandboxID, TeamID: scope(p), Offset: offset, Limit: limit, Ascending: ascending})
}
