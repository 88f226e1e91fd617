package secrets_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/secrets"
	"github.com/cella-sandbox/cella/internal/store"
)

func newBox(t *testing.T) *secrets.Box {
	t.Helper()
	b, err := secrets.OpenBox(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBoxRoundTrip(t *testing.T) {
	b := newBox(t)
	for _, v := range []string{"x", "ghp_0123456789abcdef", strings.Repeat("\x00\xff", secrets.MaxValueBytes/2)} {
		ct, err := b.Seal("GH_TOKEN", []byte(v))
		if err != nil {
			t.Fatal(err)
		}
		// A one-byte value turns up in random ciphertext by chance (~1 in 9
		// seals), so only values long enough not to do so are searched for.
		if len(v) >= 8 && bytes.Contains(ct, []byte(v)) {
			t.Fatalf("ciphertext contains the plaintext %.20q", v)
		}
		pt, err := b.Open("GH_TOKEN", ct)
		if err != nil || string(pt) != v {
			t.Fatalf("open: %v (len %d, want %d)", err, len(pt), len(v))
		}
	}
	// A fresh nonce each time: the same value never seals the same way.
	c1, _ := b.Seal("A", []byte("same value"))
	c2, _ := b.Seal("A", []byte("same value"))
	if bytes.Equal(c1, c2) {
		t.Fatal("two seals of one value are equal: nonce reused")
	}
}

func TestBoxRefusesWrongKeyTamperAndSwap(t *testing.T) {
	b := newBox(t)
	ct, err := b.Seal("GH_TOKEN", []byte("ghp_secret_value"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newBox(t).Open("GH_TOKEN", ct); !errors.Is(err, secrets.ErrDecrypt) {
		t.Fatalf("open under another master key: %v, want ErrDecrypt", err)
	}
	for i := range ct {
		bad := bytes.Clone(ct)
		bad[i] ^= 0x01
		if _, err := b.Open("GH_TOKEN", bad); err == nil {
			t.Fatalf("tampered byte %d: opened", i)
		}
	}
	if _, err := b.Open("GH_TOKEN", ct[:len(ct)-1]); err == nil {
		t.Fatal("truncated ciphertext opened")
	}
	if _, err := b.Open("OTHER", ct); !errors.Is(err, secrets.ErrDecrypt) {
		t.Fatalf("ciphertext under another name: %v, want ErrDecrypt", err)
	}
}

func TestMasterKeyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, secrets.KeyFile)
	k1, err := secrets.LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Size() != secrets.KeySize {
		t.Fatalf("master.key: mode %v size %d, want 0600 and %d", fi.Mode().Perm(), fi.Size(), secrets.KeySize)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dir, ".master.key-*")); len(leftovers) != 0 {
		t.Fatalf("temporary files left: %v", leftovers)
	}
	k2, err := secrets.LoadOrCreateKey(path)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Fatalf("second load: %v, same key %v", err, bytes.Equal(k1, k2))
	}

	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.OpenBox(dir); err == nil || !strings.Contains(err.Error(), "0644") || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("0644 master.key: %v, want a refusal naming the mode and the fix", err)
	}
	os.Chmod(path, 0o640)
	if _, err := secrets.OpenBox(dir); err == nil {
		t.Fatal("0640 master.key accepted")
	}
	os.Chmod(path, 0o400)
	if _, err := secrets.OpenBox(dir); err != nil {
		t.Fatalf("0400 master.key refused: %v", err)
	}

	os.Chmod(path, 0o600)
	if err := os.WriteFile(path, k1[:16], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.OpenBox(dir); err == nil || !strings.Contains(err.Error(), "16 bytes") {
		t.Fatalf("16-byte master.key: %v, want a refusal naming the size", err)
	}
}

// Concurrent first starts agree on one key.
func TestMasterKeyCreateRace(t *testing.T) {
	path := filepath.Join(t.TempDir(), secrets.KeyFile)
	keys := make([][]byte, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, err := secrets.LoadOrCreateKey(path)
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		})
	}
	wg.Wait()
	for _, k := range keys[1:] {
		if !bytes.Equal(k, keys[0]) {
			t.Fatal("racing creators got different keys")
		}
	}
}

func openManager(t testing.TB, dir string) (*secrets.Manager, *store.Store) {
	t.Helper()
	st, err := store.Open(filepath.Join(dir, "cella.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	box, err := secrets.OpenBox(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := secrets.NewManager(context.Background(), st, box)
	if err != nil {
		t.Fatal(err)
	}
	return m, st
}

func TestManager(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	m, st := openManager(t, dir)

	for _, name := range []string{"", "a b", "a/b", "a{b}", "ÄB", ".", "..", "sec_abc", strings.Repeat("A", 129), "a\nb"} {
		if _, err := m.Create(ctx, name, "value", nil); !errdefs.Is(err, errdefs.KindInvalidArgument) {
			t.Errorf("name %q: %v, want InvalidArgument", name, err)
		}
	}
	for _, name := range []string{strings.Repeat("A", 128), "1ABC", "openai-api-key", "stripe.live", "GH_TOKEN_2", "SEC_KEY", "..x"} {
		if _, err := m.Create(ctx, name, "value", nil); err != nil {
			t.Errorf("name %q: %v", name, err)
		}
	}
	if _, err := m.Create(ctx, "EMPTY", "", nil); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Errorf("empty value: %v", err)
	}
	big := strings.Repeat("v", secrets.MaxValueBytes+1)
	if _, err := m.Create(ctx, "BIG", big, nil); !errdefs.Is(err, errdefs.KindInvalidArgument) || strings.Contains(err.Error(), big[:10]) {
		t.Errorf("oversized value: %v", err)
	}
	if _, err := m.Create(ctx, "MAX", big[1:], nil); err != nil {
		t.Errorf("64 KiB value: %v", err)
	}

	i1, err := m.Create(ctx, "GH_TOKEN", "ghp_first", map[string]string{"owner": "ci"})
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^sec_[0-9a-z]{20}$`).MatchString(i1.ID) || i1.Version != 1 || i1.Metadata["owner"] != "ci" || !i1.UpdatedAt.Equal(i1.CreatedAt) {
		t.Fatalf("create: %+v", i1)
	}
	// Create is create: a taken name is a conflict that leaves the value.
	if _, err := m.Create(ctx, "GH_TOKEN", "ghp_clobber", nil); !errdefs.Is(err, errdefs.KindConflict) || !strings.Contains(err.Error(), "already exists") || strings.Contains(err.Error(), "clobber") {
		t.Fatalf("create twice: %v", err)
	}
	time.Sleep(2 * time.Millisecond)
	// By ID, metadata left out: kept.
	i2, err := m.Update(ctx, i1.ID, "ghp_second", nil)
	if err != nil {
		t.Fatal(err)
	}
	if i2.ID != i1.ID || i2.Version != 2 || i2.Metadata["owner"] != "ci" || !i2.CreatedAt.Equal(i1.CreatedAt) || !i2.UpdatedAt.After(i1.UpdatedAt) {
		t.Fatalf("update: %+v after %+v", i2, i1)
	}
	// By name, empty metadata: cleared.
	i3, err := m.Update(ctx, "GH_TOKEN", "ghp_third", map[string]string{})
	if err != nil || i3.Version != 3 || len(i3.Metadata) != 0 || i3.Metadata == nil {
		t.Fatalf("update by name: %+v %v", i3, err)
	}
	if _, err := m.Update(ctx, "NOPE", "v", nil); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("update missing: %v", err)
	}
	if _, err := m.Update(ctx, "GH_TOKEN", "", nil); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Fatalf("update to empty: %v", err)
	}
	// Set creates or updates, keeping the metadata.
	if i, err := m.Set(ctx, "GH_TOKEN", "ghp_fourth"); err != nil || i.Version != 4 {
		t.Fatalf("set existing: %+v %v", i, err)
	}
	if i, err := m.Set(ctx, "API_KEY", "sk-live-1234"); err != nil || i.Version != 1 {
		t.Fatalf("set new: %+v %v", i, err)
	}
	if v, err := m.Get("GH_TOKEN"); err != nil || v != "ghp_fourth" {
		t.Fatalf("get: %q %v", v, err)
	}
	for _, ref := range []string{i1.ID, "GH_TOKEN"} {
		if i, err := m.Info(ref); err != nil || i.Name != "GH_TOKEN" || i.ID != i1.ID {
			t.Fatalf("info %s: %+v %v", ref, i, err)
		}
	}
	// What Info returns is a copy.
	i, _ := m.Info("GH_TOKEN")
	i.Metadata["x"] = "y"
	if i, _ := m.Info("GH_TOKEN"); len(i.Metadata) != 0 {
		t.Fatal("a caller changed the cached metadata")
	}
	// Values are looked up by name only: placeholders carry names.
	if _, err := m.Get(i1.ID); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("get by id: %v", err)
	}
	if _, err := m.Get("NOPE"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("get missing: %v", err)
	}
	if err := m.Delete(ctx, "NOPE"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("delete missing: %v", err)
	}
	names := []string{}
	for _, i := range m.List() {
		names = append(names, i.Name)
	}
	if got := strings.Join(names, ","); got != "..x,1ABC,"+strings.Repeat("A", 128)+",API_KEY,GH_TOKEN,GH_TOKEN_2,MAX,SEC_KEY,openai-api-key,stripe.live" {
		t.Fatalf("list: %s", got)
	}

	// A restart decrypts what is stored, with the same metadata.
	if _, err := m.Update(ctx, "GH_TOKEN", "ghp_fifth", map[string]string{"owner": "ops", "ticket": "T-1"}); err != nil {
		t.Fatal(err)
	}
	want, _ := m.Info("GH_TOKEN")
	st.Close()
	m2, _ := openManager(t, dir)
	if v, err := m2.Get("GH_TOKEN"); err != nil || v != "ghp_fifth" {
		t.Fatalf("after reopen: %q %v", v, err)
	}
	if got, _ := m2.Info(i1.ID); got.Name != "GH_TOKEN" || got.Version != 5 || !maps.Equal(got.Metadata, want.Metadata) || !got.CreatedAt.Equal(want.CreatedAt) || !got.UpdatedAt.Equal(want.UpdatedAt) {
		t.Fatalf("after reopen: %+v, want %+v", got, want)
	}
	if err := m2.Delete(ctx, i1.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Get("GH_TOKEN"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	if _, err := m2.Info(i1.ID); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("info by id after delete: %v", err)
	}
	// The name is free again, under a new ID.
	if i, err := m2.Create(ctx, "GH_TOKEN", "ghp_again", nil); err != nil || i.ID == i1.ID || i.Version != 1 {
		t.Fatalf("re-create: %+v %v", i, err)
	}
}

func TestMetadataLimits(t *testing.T) {
	ctx := context.Background()
	m, _ := openManager(t, t.TempDir())
	many := map[string]string{}
	for i := range secrets.MaxMetadataEntries + 1 {
		many[fmt.Sprintf("k%02d", i)] = "v"
	}
	total := map[string]string{}
	for i := range 9 {
		total[fmt.Sprintf("k%d", i)] = strings.Repeat("v", 1000)
	}
	for _, tc := range []struct {
		md   map[string]string
		want string
	}{
		{many, "33 entries, the limit is 32"},
		{map[string]string{strings.Repeat("k", 129): "v"}, "is 129 bytes, the limit is 128"},
		{map[string]string{"k": strings.Repeat("v", 1025)}, "is 1025 bytes, the limit is 1024"},
		{total, "the limit is 8192"},
	} {
		if _, err := m.Create(ctx, "S", "value", tc.md); !errdefs.Is(err, errdefs.KindInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("create: %v, want %q", err, tc.want)
		}
	}
	delete(many, "k00")
	atLimit := map[string]string{strings.Repeat("k", 128): strings.Repeat("v", 1024)}
	for _, md := range []map[string]string{many, atLimit} {
		if _, err := m.Create(ctx, "S", "value", md); err != nil {
			t.Fatalf("metadata at the limits: %v", err)
		}
		if err := m.Delete(ctx, "S"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Create(ctx, "S", "value", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Update(ctx, "S", "value2", map[string]string{"k": strings.Repeat("v", 1025)}); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Fatalf("update with oversized metadata: %v", err)
	}
	if i, _ := m.Info("S"); i.Version != 1 {
		t.Fatalf("a refused update changed the version: %d", i.Version)
	}
}

// A secrets table of the first release (no id, version or metadata
// column) is migrated in place: its secrets keep their values and get IDs.
func TestMigrateOldTable(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	box, err := secrets.OpenBox(dir)
	if err != nil {
		t.Fatal(err)
	}
	ct, err := box.Seal("OLD_TOKEN", []byte("old-value"))
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "cella.db"))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE secrets (name TEXT PRIMARY KEY, ciphertext BLOB NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec(`INSERT INTO secrets VALUES(?,?,?,?)`, "OLD_TOKEN", ct, 1700000000000, 1700000001000); err != nil {
		t.Fatal(err)
	}
	db.Close()

	m, st := openManager(t, dir)
	i, err := m.Info("OLD_TOKEN")
	if err != nil || !strings.HasPrefix(i.ID, "sec_") || i.Version != 1 || i.Metadata == nil || len(i.Metadata) != 0 || i.CreatedAt.UnixMilli() != 1700000000000 {
		t.Fatalf("migrated: %+v %v", i, err)
	}
	if v, _ := m.Get("OLD_TOKEN"); v != "old-value" {
		t.Fatalf("migrated value: %q", v)
	}
	if _, err := m.Update(ctx, i.ID, "new-value", nil); err != nil {
		t.Fatal(err)
	}
	// A second start neither fails on the existing columns nor changes IDs.
	st.Close()
	m2, _ := openManager(t, dir)
	if i2, err := m2.Info(i.ID); err != nil || i2.Version != 2 {
		t.Fatalf("after restart: %+v %v", i2, err)
	}
}

func TestExpand(t *testing.T) {
	vals := map[string]string{"GH_TOKEN": "ghp_abc", "openai-api-key": "sk-1", "odd": "${e2b.secrets.GH_TOKEN}"}
	calls := 0
	get := func(name string) (string, error) {
		calls++
		v, ok := vals[name]
		if !ok {
			return "", errdefs.NotFound("secret %q not found", name)
		}
		return v, nil
	}
	for _, tc := range []struct {
		in, out string
		names   []string
	}{
		{"no placeholders", "no placeholders", nil},
		{"", "", nil},
		{"Bearer ${e2b.secrets.GH_TOKEN}", "Bearer ghp_abc", []string{"GH_TOKEN"}},
		{"Bearer ${secret:GH_TOKEN}", "Bearer ghp_abc", []string{"GH_TOKEN"}},
		{"${secret:openai-api-key}:${e2b.secrets.GH_TOKEN}/${e2b.secrets.openai-api-key}", "sk-1:ghp_abc/sk-1", []string{"openai-api-key", "GH_TOKEN"}},
		// One pass: a value that looks like a placeholder stays as it is.
		{"x ${e2b.secrets.odd} y", "x ${e2b.secrets.GH_TOKEN} y", []string{"odd"}},
		// Other ${...} and lone braces are text.
		{"${HOME} {} ${e2b.other} $", "${HOME} {} ${e2b.other} $", nil},
	} {
		out, names, err := secrets.Expand(tc.in, get)
		if err != nil || out != tc.out || !slices.Equal(names, tc.names) {
			t.Errorf("Expand(%q) = %q %q %v, want %q %q", tc.in, out, names, err, tc.out, tc.names)
		}
	}
	for _, tc := range []struct {
		in, want string
		kind     errdefs.Kind
	}{
		{"Bearer ${e2b.secrets.NOPE}", `unknown secret "NOPE"`, errdefs.KindNotFound},
		{"${secret:GH_TOKEN} ${secret:MISSING}", `unknown secret "MISSING"`, errdefs.KindNotFound},
		{"Bearer ${e2b.secrets.GH_TOKEN", "not closed", errdefs.KindInvalidArgument},
		{"${e2b.secrets.}", "not a secret name", errdefs.KindInvalidArgument},
		{"${e2b.secrets.a b}", "not a secret name", errdefs.KindInvalidArgument},
		{"${e2b.secrets.${secret:GH_TOKEN}}", "not a secret name", errdefs.KindInvalidArgument},
	} {
		out, names, err := secrets.Expand(tc.in, get)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errdefs.Is(err, tc.kind) || out != "" || names != nil {
			t.Errorf("Expand(%q) = %q %q %v, want an error with %q", tc.in, out, names, err, tc.want)
			continue
		}
		// An error never carries a value, even one already resolved.
		for _, v := range vals {
			if strings.Contains(err.Error(), v) && !strings.Contains(tc.in, v) {
				t.Errorf("Expand(%q) error %q carries a value", tc.in, err)
			}
		}
	}
	// Other lookup failures are wrapped with the name.
	boom := errors.New("store is down")
	if _, _, err := secrets.Expand("${secret:A}", func(string) (string, error) { return "", boom }); !errors.Is(err, boom) || !strings.Contains(err.Error(), `"A"`) {
		t.Fatalf("lookup failure: %v", err)
	}
	if _, _, err := secrets.Expand("${secret:A}", nil); err == nil {
		t.Fatal("nil lookup with a placeholder: no error")
	}
	if out, _, err := secrets.Expand("plain", nil); err != nil || out != "plain" {
		t.Fatalf("nil lookup without placeholders: %q %v", out, err)
	}

	// Through a Manager, and with E2B's Secret.fill form.
	m, _ := openManager(t, t.TempDir())
	if _, err := m.Create(context.Background(), "openai-api-key", "sk-live-xyz", nil); err != nil {
		t.Fatal(err)
	}
	out, names, err := secrets.Expand("Bearer "+secrets.Placeholder("openai-api-key"), m.Get)
	if err != nil || out != "Bearer sk-live-xyz" || !slices.Equal(names, []string{"openai-api-key"}) {
		t.Fatalf("with a manager: %q %q %v", out, names, err)
	}
}

// With another master.key the stored secrets do not open, and the manager
// says so instead of starting without them.
func TestManagerWrongMasterKey(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	m, st := openManager(t, dir)
	if _, err := m.Set(ctx, "GH_TOKEN", "ghp_value"); err != nil {
		t.Fatal(err)
	}
	other, err := secrets.OpenBox(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.NewManager(ctx, st, other); err == nil || !strings.Contains(err.Error(), "GH_TOKEN") || !strings.Contains(err.Error(), "master.key") {
		t.Fatalf("wrong master key: %v", err)
	}
}

// The database file and its WAL hold ciphertexts only.
func TestNoPlaintextOnDisk(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	m, _ := openManager(t, dir)
	const value = "PLAINTEXT-MARKER-7f3a9c"
	for _, n := range []string{"A", "B", "C"} {
		if _, err := m.Set(ctx, n, value+n); err != nil {
			t.Fatal(err)
		}
	}
	checked := 0
	for _, f := range []string{"cella.db", "cella.db-wal"} {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		checked++
		t.Logf("%s: %d bytes, no plaintext", f, len(data))
		if bytes.Contains(data, []byte("PLAINTEXT-MARKER")) {
			t.Fatalf("%s contains a secret value", f)
		}
	}
	if checked == 0 {
		t.Fatal("no database file to check")
	}
}

func TestRedact(t *testing.T) {
	ctx := context.Background()
	m, _ := openManager(t, t.TempDir())
	if got := m.Redact("nothing to hide"); got != "nothing to hide" {
		t.Fatalf("no secrets: %q", got)
	}
	var nilM *secrets.Manager
	if got := nilM.Redact("x"); got != "x" {
		t.Fatalf("nil manager: %q", got)
	}
	for n, v := range map[string]string{"GH_TOKEN": "ghp_abcdef", "LONG": "ghp_abcdef_and_more", "PIN": "123", "AWS": "AKIA0000"} {
		if _, err := m.Set(ctx, n, v); err != nil {
			t.Fatal(err)
		}
	}
	in := "Authorization: token ghp_abcdef; again ghp_abcdef_and_more, AKIA0000AKIA0000 and pin 123"
	want := "Authorization: token [secret:GH_TOKEN]; again [secret:LONG], [secret:AWS][secret:AWS] and pin 123"
	if got := m.Redact(in); got != want {
		t.Fatalf("redact:\n got %q\nwant %q", got, want)
	}
	if err := m.Delete(ctx, "GH_TOKEN"); err != nil {
		t.Fatal(err)
	}
	if got := m.Redact("ghp_abcdef"); got != "ghp_abcdef" {
		t.Fatalf("deleted secret still redacted: %q", got)
	}
	if _, err := m.Set(ctx, "AWS", "new-value"); err != nil {
		t.Fatal(err)
	}
	if got := m.Redact("AKIA0000 new-value"); got != "AKIA0000 [secret:AWS]" {
		t.Fatalf("after replace: %q", got)
	}
}

// TestReplace: the placeholder parser the egress proxy shares with Expand
// hands fn each placeholder in order, returns fn's own error untouched, and
// refuses malformed placeholders.
func TestReplace(t *testing.T) {
	var seen []string
	out, err := secrets.Replace("a ${e2b.secrets.X} b ${secret:Y.z} ${secret:X}", func(prefix, name string) (string, error) {
		seen = append(seen, prefix+name)
		return "<" + name + ">", nil
	})
	if err != nil || out != "a <X> b <Y.z> <X>" || !slices.Equal(seen, []string{"${e2b.secrets.X", "${secret:Y.z", "${secret:X"}) {
		t.Fatalf("Replace = %q, %v; fn saw %v", out, err, seen)
	}
	if out, err := secrets.Replace("no placeholders {here}", nil); err != nil || out != "no placeholders {here}" {
		t.Fatalf("without placeholders: %q %v", out, err)
	}
	own := errors.New("fn's own error")
	if _, err := secrets.Replace("${secret:A}", func(_, _ string) (string, error) { return "", own }); err != own {
		t.Fatalf("fn's error came back as %v", err)
	}
	for _, bad := range []string{"${secret:A", "${e2b.secrets.}", "${secret:a b}"} {
		if _, err := secrets.Replace(bad, func(_, _ string) (string, error) { return "", nil }); !errdefs.Is(err, errdefs.KindInvalidArgument) {
			t.Errorf("Replace(%q): %v, want InvalidArgument", bad, err)
		}
	}
}

// TestNames: the secret names a text's placeholders use, each once in order
// of first use, nil without placeholders, and Replace's error (no names) for
// a malformed one. A text has a placeholder prefix exactly when Names finds
// a name or fails: the API's secret check relies on it.
func TestNames(t *testing.T) {
	for _, tc := range []struct {
		in    string
		names []string
	}{
		{"plain {text}", nil},
		{"", nil},
		{"Bearer ${e2b.secrets.B}", []string{"B"}},
		{"${secret:B} ${e2b.secrets.A} ${secret:B} ${e2b.secrets.c-1.d_2}", []string{"B", "A", "c-1.d_2"}},
		{"${e2b.secrets.X}${secret:X}", []string{"X"}},
		{"$ {secret:A} ${secret} ${e2b.secret.A}", nil},
	} {
		names, err := secrets.Names(tc.in)
		if err != nil || !slices.Equal(names, tc.names) || (tc.names == nil) != (names == nil) {
			t.Errorf("Names(%q) = %q, %v; want %q", tc.in, names, err, tc.names)
		}
	}
	for _, bad := range []string{"${secret:A", "x ${e2b.secrets.}", "${secret:a b}", "${secret:A} ${secret:", "${secret:" + strings.Repeat("a", 129) + "}"} {
		if names, err := secrets.Names(bad); !errdefs.Is(err, errdefs.KindInvalidArgument) || names != nil {
			t.Errorf("Names(%q) = %q, %v; want no names and InvalidArgument", bad, names, err)
		}
	}
	for _, s := range []string{"plain", "${secret:A}", "a ${e2b.secrets.B} b", "${secret:", "${e2b.secrets.bad name}", "${secret}", "{secret:A}"} {
		hasPrefix := strings.Contains(s, secrets.PlaceholderPrefix) || strings.Contains(s, secrets.AliasPrefix)
		names, err := secrets.Names(s)
		if got := err != nil || len(names) > 0; got != hasPrefix {
			t.Errorf("Names(%q) = %q, %v: found a placeholder %v, but the text has a prefix: %v", s, names, err, got, hasPrefix)
		}
	}
}

// TestNewRedactor: the redactor Manager.Redact uses, built from a name to
// value map: values shorter than minLen are left alone (an empty one always
// is), the longest of overlapping values wins, and equal values redact as
// the name that sorts first.
func TestNewRedactor(t *testing.T) {
	if r := secrets.NewRedactor(nil, 1); r != nil {
		t.Fatal("a redactor for no values")
	}
	if r := secrets.NewRedactor(map[string]string{"PIN": "123", "EMPTY": ""}, 4); r != nil {
		t.Fatal("a redactor for values all too short")
	}
	values := map[string]string{"A": "abcd", "B": "abcdXYZ", "PIN": "123", "SAME2": "same-value", "SAME1": "same-value", "EMPTY": ""}
	for i := range 20 {
		r := secrets.NewRedactor(values, 4)
		in := "abcdXYZ abcd abcdXY 123 same-value"
		if got, want := r.Replace(in), "[secret:B] [secret:A] [secret:A]XY 123 [secret:SAME1]"; got != want {
			t.Fatalf("round %d: minLen 4:\n got %q\nwant %q", i, got, want)
		}
		if got, want := secrets.NewRedactor(values, 0).Replace(in), "[secret:B] [secret:A] [secret:A]XY [secret:PIN] [secret:SAME1]"; got != want {
			t.Fatalf("round %d: minLen 0:\n got %q\nwant %q", i, got, want)
		}
	}
}
