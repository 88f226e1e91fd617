// Package secrets keeps operator-level secrets (API tokens and the like)
// that the egress proxy injects into sandbox traffic, so the values never
// enter a sandbox.
//
// Values are encrypted with AES-256-GCM under a master key kept in
// <data-dir>/master.key (32 random bytes, mode 0600, made on first use).
// The database holds only ciphertexts, each sealed with a fresh nonce and
// its secret's name as additional data, so a copy of cella.db alone reveals
// nothing and a ciphertext moved to another name does not open. Losing
// master.key loses every stored value.
//
// A secret has a stable random ID ("sec_" and 20 lowercase letters and
// digits) and a unique name; the API accepts either wherever it takes one.
// Its version starts at 1 and grows by one with each update, as in E2B, but
// only the current value is stored: an update overwrites the old one.
//
// The Manager keeps the plaintexts in memory: Get is on the proxy's
// connection path and Redact runs over every log and audit line.
package secrets

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/store"
)

// MaxValueBytes is the largest value a secret may have.
const MaxValueBytes = 64 << 10

// MinRedactBytes is the shortest value Redact replaces: shorter values
// would match all over ordinary text and make every log unreadable.
const MinRedactBytes = 4

// Limits of a secret's metadata; they are E2B's, so metadata E2B accepts is
// accepted here and the other way round.
const (
	MaxMetadataEntries    = 32
	MaxMetadataKeyBytes   = 128
	MaxMetadataValueBytes = 1024
	// MaxMetadataBytes bounds the sum of every key's and value's length.
	MaxMetadataBytes = 8192
)

// The name charset is what E2B users put in ${e2b.secrets.NAME}
// ("openai-api-key", "GH_TOKEN", "stripe.live") and what needs no escaping
// in a URL path or a header template. E2B itself only forbids '{', '}' and
// control characters, but it lower-cases names; cella keeps them as given
// and compares them exactly.
var nameRe = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

// ValidateName checks a secret name: 1-128 letters, digits, '_', '.' and
// '-', not "." or ".." (which a URL path cannot carry) and not starting with
// "sec_", which marks secret IDs so that /secrets/{ref} is never ambiguous.
func ValidateName(name string) error {
	if !nameRe.MatchString(name) || name == "." || name == ".." {
		return errdefs.InvalidArgument("invalid secret name %s: use 1-128 letters, digits, '_', '.' and '-' (and not just \".\" or \"..\")", quoteName(name))
	}
	if strings.HasPrefix(name, store.SecretIDPrefix) {
		return errdefs.InvalidArgument("invalid secret name %s: the prefix %q is reserved for secret IDs", quoteName(name), store.SecretIDPrefix)
	}
	return nil
}

// quoteName quotes a name for an error message, shortened: a rejected name
// may be arbitrarily long.
func quoteName(name string) string {
	if len(name) > 140 {
		return fmt.Sprintf("%q… (%d bytes)", name[:128], len(name))
	}
	return fmt.Sprintf("%q", name)
}

// validateValue checks a value. The messages name the rule and the length,
// never the value.
func validateValue(name, value string) error {
	if value == "" {
		return errdefs.InvalidArgument("secret %q: value must not be empty", name)
	}
	if len(value) > MaxValueBytes {
		return errdefs.InvalidArgument("secret %q: value is %d bytes, the limit is %d (64 KiB)", name, len(value), MaxValueBytes)
	}
	return nil
}

// ValidateMetadata checks metadata against E2B's limits: at most 32
// entries, keys of at most 128 bytes, values of at most 1024, and 8192
// bytes in all.
func ValidateMetadata(md map[string]string) error {
	if len(md) > MaxMetadataEntries {
		return errdefs.InvalidArgument("metadata has %d entries, the limit is %d", len(md), MaxMetadataEntries)
	}
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	// Sorted so that the same input always gets the same message.
	sort.Strings(keys)
	total := 0
	for _, k := range keys {
		v := md[k]
		if len(k) > MaxMetadataKeyBytes {
			return errdefs.InvalidArgument("metadata key %s is %d bytes, the limit is %d", quoteName(k), len(k), MaxMetadataKeyBytes)
		}
		if len(v) > MaxMetadataValueBytes {
			return errdefs.InvalidArgument("metadata value of key %q is %d bytes, the limit is %d", k, len(v), MaxMetadataValueBytes)
		}
		total += len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return errdefs.InvalidArgument("metadata is %d bytes in all (keys and values), the limit is %d", total, MaxMetadataBytes)
	}
	return nil
}

// Info is a secret's public part: never its value.
type Info struct {
	// ID is "sec_" and 20 lowercase letters and digits, fixed at creation.
	ID   string
	Name string
	// Version is 1 at creation and grows by one with each Update. Only the
	// current version's value is kept: older values are overwritten, not
	// archived, so a version number cannot be used to read one back.
	Version int64
	// Metadata is never nil. It is stored and returned in plaintext.
	Metadata  map[string]string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// clone copies the metadata map, so callers may keep or change what they
// get without touching the cache.
func (i Info) clone() Info {
	i.Metadata = maps.Clone(i.Metadata)
	if i.Metadata == nil {
		i.Metadata = map[string]string{}
	}
	return i
}

type entry struct {
	info  Info
	value string
}

// Records is where a Manager keeps its secrets, sealed: a node's store
// (store.Store), or a cluster's Kubernetes Secret (cluster.SecretRecords).
type Records interface {
	ListSecrets(ctx context.Context) ([]store.Secret, error)
	// CreateSecret reports a taken name as store.ErrSecretExists.
	CreateSecret(ctx context.Context, sec store.Secret) error
	// UpdateSecret reports an unknown ID as store.ErrNotFound.
	UpdateSecret(ctx context.Context, sec store.Secret) error
	DeleteSecret(ctx context.Context, id string) error
}

var _ Records = (*store.Store)(nil)

// Manager stores secrets encrypted in the store and serves their
// plaintexts from memory.
type Manager struct {
	store Records
	box   *Box

	// mu is held across a write's database call too, so the cache and the
	// table change in the same order.
	mu      sync.RWMutex
	entries map[string]entry  // by name
	byID    map[string]string // ID → name

	// redactor is rebuilt on every change and read without the lock: it is
	// used on hot logging paths.
	redactor atomic.Pointer[strings.Replacer]
}

// NewManager decrypts every stored secret. A secret that does not open is an error: it means master.key is
// not the key the secrets were stored under, and serving without them would
// break every rule that injects one.
func NewManager(ctx context.Context, st Records, box *Box) (*Manager, error) {
	m := &Manager{store: st, box: box}
	if err := m.Reload(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// Reload reads every secret again: a cluster node's view of what other
// nodes changed in the records they share. On a failure (a secret that
// does not open, the records unreadable) the secrets served stay as they
// were.
func (m *Manager) Reload(ctx context.Context) error {
	recs, err := m.store.ListSecrets(ctx)
	if err != nil {
		return err
	}
	entries, byID := make(map[string]entry, len(recs)), make(map[string]string, len(recs))
	for _, rec := range recs {
		pt, err := m.box.Open(rec.Name, rec.Ciphertext)
		if err != nil {
			return fmt.Errorf("decrypt secret %q: %w", rec.Name, err)
		}
		entries[rec.Name] = entry{info: infoOf(rec), value: string(pt)}
		byID[rec.ID] = rec.Name
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.entries, m.byID = entries, byID
	m.rebuildLocked()
	return nil
}

func infoOf(rec store.Secret) Info {
	return Info{ID: rec.ID, Name: rec.Name, Version: rec.Version, Metadata: rec.Metadata, CreatedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt}.clone()
}

// lookupLocked finds a secret by ID or by name. IDs and names cannot
// collide: names may not start with the ID prefix.
func (m *Manager) lookupLocked(ref string) (entry, bool) {
	if name, ok := m.byID[ref]; ok {
		ref = name
	}
	e, ok := m.entries[ref]
	return e, ok
}

func notFound(ref string) error {
	return errdefs.NotFound("secret %s not found", quoteName(ref))
}

// now is what the store keeps: millisecond precision, so the cache says the
// same as a restarted daemon would.
func now() time.Time { return time.Now().Truncate(time.Millisecond) }

// Create stores a new secret at version 1. A name already taken is a
// Conflict: changing a value is Update's job, so a create can never
// silently replace a secret someone else relies on. Nil metadata is none.
func (m *Manager) Create(ctx context.Context, name, value string, md map[string]string) (Info, error) {
	if err := ValidateName(name); err != nil {
		return Info{}, err
	}
	if err := validateValue(name, value); err != nil {
		return Info{}, err
	}
	if err := ValidateMetadata(md); err != nil {
		return Info{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.createLocked(ctx, name, value, md)
}

func (m *Manager) createLocked(ctx context.Context, name, value string, md map[string]string) (Info, error) {
	if e, ok := m.entries[name]; ok {
		return Info{}, exists(name, e.info.ID)
	}
	id, err := store.NewSecretID()
	if err != nil {
		return Info{}, err
	}
	ct, err := m.box.Seal(name, []byte(value))
	if err != nil {
		return Info{}, fmt.Errorf("encrypt secret %s: %w", name, err)
	}
	t := now()
	info := Info{ID: id, Name: name, Version: 1, Metadata: md, CreatedAt: t, UpdatedAt: t}.clone()
	rec := store.Secret{ID: id, Name: name, Ciphertext: ct, Version: 1, Metadata: info.Metadata, CreatedAt: t, UpdatedAt: t}
	if err := m.store.CreateSecret(ctx, rec); err != nil {
		if errors.Is(err, store.ErrSecretExists) {
			// Another process sharing the database made it meanwhile.
			return Info{}, exists(name, "")
		}
		return Info{}, err
	}
	m.entries[name] = entry{info: info, value: value}
	m.byID[id] = name
	m.rebuildLocked()
	return info.clone(), nil
}

func exists(name, id string) error {
	ref := name
	if id != "" {
		ref = id
	}
	return errdefs.Conflict("secret %q already exists: to change its value update it (POST /secrets/%s; Secret.update in the E2B SDK; cella secret set), or delete it first", name, ref)
}

// Update stores a new value for the secret ref (an ID or a name) and bumps
// its version. Metadata replaces the stored metadata when not nil (an empty
// map clears it) and is left as is when nil.
func (m *Manager) Update(ctx context.Context, ref, value string, md map[string]string) (Info, error) {
	if err := ValidateMetadata(md); err != nil {
		return Info{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.lookupLocked(ref)
	if !ok {
		return Info{}, notFound(ref)
	}
	return m.updateLocked(ctx, e, value, md)
}

func (m *Manager) updateLocked(ctx context.Context, e entry, value string, md map[string]string) (Info, error) {
	name := e.info.Name
	if err := validateValue(name, value); err != nil {
		return Info{}, err
	}
	ct, err := m.box.Seal(name, []byte(value))
	if err != nil {
		return Info{}, fmt.Errorf("encrypt secret %s: %w", name, err)
	}
	info := e.info.clone()
	info.Version++
	info.UpdatedAt = now()
	if md != nil {
		info.Metadata = maps.Clone(md)
	}
	rec := store.Secret{ID: info.ID, Name: name, Ciphertext: ct, Version: info.Version, Metadata: info.Metadata, CreatedAt: info.CreatedAt, UpdatedAt: info.UpdatedAt}
	if err := m.store.UpdateSecret(ctx, rec); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return Info{}, notFound(name)
		}
		return Info{}, err
	}
	m.entries[name] = entry{info: info, value: value}
	m.rebuildLocked()
	return info.clone(), nil
}

// Set creates the secret name, or updates its value keeping its metadata.
func (m *Manager) Set(ctx context.Context, name, value string) (Info, error) {
	if err := ValidateName(name); err != nil {
		return Info{}, err
	}
	if err := validateValue(name, value); err != nil {
		return Info{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.entries[name]; ok {
		return m.updateLocked(ctx, e, value, nil)
	}
	return m.createLocked(ctx, name, value, nil)
}

// Get returns the plaintext of the secret name. Only the egress proxy
// should call it: the API never hands values out.
func (m *Manager) Get(name string) (string, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	e, ok := m.entries[name]
	if !ok {
		return "", notFound(name)
	}
	return e.value, nil
}

// Info returns the metadata of the secret ref, an ID or a name.
func (m *Manager) Info(ref string) (Info, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	e, ok := m.lookupLocked(ref)
	if !ok {
		return Info{}, notFound(ref)
	}
	return e.info.clone(), nil
}

// List returns every secret's metadata, by name.
func (m *Manager) List() []Info {
	m.mu.RLock()
	out := make([]Info, 0, len(m.entries))
	for _, e := range m.entries {
		out = append(out, e.info.clone())
	}
	m.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Delete removes the secret ref, an ID or a name.
func (m *Manager) Delete(ctx context.Context, ref string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.lookupLocked(ref)
	if !ok {
		return notFound(ref)
	}
	if err := m.store.DeleteSecret(ctx, e.info.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	delete(m.entries, e.info.Name)
	delete(m.byID, e.info.ID)
	m.rebuildLocked()
	return nil
}

// Redact replaces every occurrence of a current secret value of at least
// MinRedactBytes bytes in text with [secret:NAME]. Where values overlap the
// longest wins. A nil Manager returns text unchanged, so callers may pass
// m.Redact whether or not secrets are configured. Only verbatim values are
// found: an encoded form (base64, URL escaping) is not.
func (m *Manager) Redact(text string) string {
	if m == nil {
		return text
	}
	r := m.redactor.Load()
	if r == nil {
		return text
	}
	return r.Replace(text)
}

func (m *Manager) rebuildLocked() {
	values := make(map[string]string, len(m.entries))
	for _, e := range m.entries {
		values[e.info.Name] = e.value
	}
	m.redactor.Store(NewRedactor(values, MinRedactBytes))
}

// NewRedactor returns a replacer of every value of values (secret name to
// value) at least minLen bytes long with [secret:NAME], or nil when no
// value is that long. A minLen below 1 is 1: an empty value would match
// everywhere. Where values overlap the longest wins, so a value that
// contains another is redacted as a whole, and equal values redact as the
// name that sorts first. Manager.Redact and the egress proxy's per-
// connection redaction both use it.
func NewRedactor(values map[string]string, minLen int) *strings.Replacer {
	minLen = max(minLen, 1)
	type pair struct{ name, value string }
	ps := make([]pair, 0, len(values))
	for name, v := range values {
		if len(v) >= minLen {
			ps = append(ps, pair{name, v})
		}
	}
	if len(ps) == 0 {
		return nil
	}
	// strings.Replacer tries its patterns in argument order at each
	// position: longest first makes a value that contains another redact
	// as a whole, and names break ties so equal values redact stably.
	sort.Slice(ps, func(i, j int) bool {
		if len(ps[i].value) != len(ps[j].value) {
			return len(ps[i].value) > len(ps[j].value)
		}
		return ps[i].name < ps[j].name
	})
	pairs := make([]string, 0, 2*len(ps))
	for _, p := range ps {
		pairs = append(pairs, p.value, "[secret:"+p.name+"]")
	}
	return strings.NewReplacer(pairs...)
}
