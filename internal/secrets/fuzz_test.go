package secrets_test

// Fuzz targets of the placeholder parser (which header rules, the API's
// secret checks and env expansion share) and of redaction. `go test` runs
// the seeds and testdata/fuzz; `go test -run=^$ -fuzz=FuzzReplace
// ./internal/secrets/` explores.

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/secrets"
)

var placeholderSeeds = []string{
	"", "plain {text}", "Bearer ${e2b.secrets.B}", "${secret:B} ${e2b.secrets.A} ${secret:B} ${e2b.secrets.c-1.d_2}",
	"${e2b.secrets.X}${secret:X}", "$ {secret:A} ${secret} ${e2b.secret.A}", "${secret:A", "x ${e2b.secrets.}",
	"${secret:a b}", "${secret:A} ${secret:", "${secret:${secret:A}}", "${secret:" + strings.Repeat("a", 129) + "}",
	"${secret:" + strings.Repeat("a", 128) + "}", "${e2b.secrets.${secret:A}", "}}${{secret:A}", "\x00${secret:\xff}",
}

// FuzzReplace: Names, Replace and Expand agree on what the placeholders of
// a text are; replacing each by itself gives the text back; a text without
// a placeholder prefix is never touched; values are not expanded again;
// every error is InvalidArgument (or fn's own, unchanged).
func FuzzReplace(f *testing.F) {
	for _, s := range placeholderSeeds {
		f.Add(s, "value")
	}
	f.Add("${secret:A}", "${secret:A}")
	f.Add("a${secret:A}b", "")
	f.Fuzz(func(t *testing.T, s, value string) {
		names, nerr := secrets.Names(s)
		var seen []string
		self, rerr := secrets.Replace(s, func(prefix, name string) (string, error) {
			seen = append(seen, name)
			return prefix + name + "}", nil
		})
		if (nerr == nil) != (rerr == nil) {
			t.Fatalf("Names(%q) error %v but Replace error %v", s, nerr, rerr)
		}
		hasPrefix := strings.Contains(s, secrets.PlaceholderPrefix) || strings.Contains(s, secrets.AliasPrefix)
		if nerr != nil {
			if !errdefs.Is(nerr, errdefs.KindInvalidArgument) || names != nil {
				t.Fatalf("Names(%q) = %q, %v: want no names and InvalidArgument", s, names, nerr)
			}
			if !hasPrefix {
				t.Fatalf("Names(%q) failed without a placeholder prefix: %v", s, nerr)
			}
			return
		}
		if self != s {
			t.Fatalf("replacing each placeholder of %q by itself gave %q", s, self)
		}
		if (len(names) > 0) != hasPrefix {
			t.Fatalf("Names(%q) = %q, but the text has a placeholder prefix: %v", s, names, hasPrefix)
		}
		if !slices.Equal(names, uniq(seen)) {
			t.Fatalf("Names(%q) = %q, Replace saw %q", s, names, seen)
		}
		for _, n := range names {
			if err := secrets.ValidateName(n); err != nil && !strings.HasPrefix(n, "sec_") && n != "." && n != ".." {
				t.Fatalf("placeholder name %q is not a secret name: %v", n, err)
			}
		}

		// Expand: one pass (a value that looks like a placeholder stays as
		// it is), the names used in order, each once.
		out, used, err := secrets.Expand(s, func(string) (string, error) { return value, nil })
		if err != nil {
			t.Fatalf("Expand(%q) failed where Names did not: %v", s, err)
		}
		if !slices.Equal(used, names) {
			t.Fatalf("Expand(%q) used %q, Names says %q", s, used, names)
		}
		want, _ := secrets.Replace(s, func(_, _ string) (string, error) { return value, nil })
		if out != want {
			t.Fatalf("Expand(%q) = %q, Replace gives %q", s, out, want)
		}
		if len(names) == 0 && out != s {
			t.Fatalf("Expand changed %q, which has no placeholder, to %q", s, out)
		}

		// A failing lookup fails the whole text.
		own := errors.New("lookup failed")
		if _, err := secrets.Replace(s, func(_, _ string) (string, error) { return "", own }); len(names) > 0 && err != own {
			t.Fatalf("fn's error came back as %v", err)
		}
		if _, _, err := secrets.Expand(s, func(name string) (string, error) {
			return "", errdefs.NotFound("no %s", name)
		}); len(names) > 0 && !errdefs.Is(err, errdefs.KindNotFound) {
			t.Fatalf("Expand with an unknown secret: %v", err)
		}
	})
}

func uniq(s []string) []string {
	var out []string
	for _, x := range s {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// FuzzRedact: no secret value of at least minLen bytes survives redaction
// (values that contain the marker's brackets, or that the markers
// themselves contain, are left out: a marker can make them appear); a text
// without values is unchanged.
func FuzzRedact(f *testing.F) {
	f.Add("token abcd and abcdef here", "abcd", "abcdef", 4)
	f.Add("xxabcdefyy", "abcd", "cdef", 4)
	f.Add("aaaa", "aa", "aaa", 1)
	f.Add("no secrets here", "zzzz", "yyyy", 4)
	f.Add("abab", "ab", "ba", 2)
	f.Add("", "", "x", 0)
	f.Fuzz(func(t *testing.T, text, a, b string, minLen int) {
		if minLen > 64 || minLen < -1 {
			return
		}
		values := map[string]string{"A": a, "B": b}
		r := secrets.NewRedactor(values, minLen)
		if r == nil {
			if len(a) >= max(minLen, 1) || len(b) >= max(minLen, 1) {
				t.Fatalf("no redactor for values %q, %q of at least %d bytes", a, b, minLen)
			}
			return
		}
		out := r.Replace(text)
		markers := "[secret:A][secret:B]"
		for _, v := range []string{a, b} {
			if len(v) < max(minLen, 1) || strings.ContainsAny(v, "[]") || strings.Contains(markers, v) {
				continue
			}
			if strings.Contains(out, v) {
				t.Fatalf("redacting %q (A=%q, B=%q, min %d) left %q in %q", text, a, b, minLen, v, out)
			}
		}
		if !strings.Contains(text, a) && !strings.Contains(text, b) && out != text {
			t.Fatalf("a text without values changed: %q → %q", text, out)
		}
	})
}

// FuzzManager: POST /secrets and POST /secrets/{id} bodies reach the
// manager as name, value and metadata: it stores a secret or refuses with
// InvalidArgument (or Conflict for a taken name) without naming the value;
// what it stores reads back as given, and an update keeps the metadata
// when none is sent.
func FuzzManager(f *testing.F) {
	f.Add("GH_TOKEN", "ghp_secretvalue", "owner", "ci")
	f.Add("", "x", "", "")
	f.Add("sec_abc", "value-of-it", "k", "v")
	f.Add("a b", "value-of-it", "k", "v")
	f.Add("X", "", "k", "v")
	f.Add("X", "value-of-it", strings.Repeat("k", 129), "v")
	f.Add("X", "value-of-it", "k", strings.Repeat("v", 1025))
	f.Add("..", "value-of-it", "", "")
	f.Add("X", "\x00\xff", "k\x00", "v")
	m, _ := openManager(f, f.TempDir())
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, name, value, mdKey, mdValue string) {
		md := map[string]string{mdKey: mdValue}
		if mdKey == "" {
			md = nil
		}
		info, err := m.Create(ctx, name, value, md)
		if err != nil {
			if !errdefs.Is(err, errdefs.KindInvalidArgument) && !errdefs.Is(err, errdefs.KindConflict) {
				t.Fatalf("Create(%q): %v is neither InvalidArgument nor Conflict", name, err)
			}
			if len(value) >= 8 && strings.Contains(err.Error(), value) && !strings.Contains(name+mdKey+mdValue, value) {
				t.Fatalf("Create's error names the value: %v", err)
			}
			return
		}
		defer func() {
			if err := m.Delete(ctx, info.ID); err != nil {
				t.Fatal(err)
			}
		}()
		if err := secrets.ValidateName(name); err != nil {
			t.Fatalf("stored a secret named %q: %v", name, err)
		}
		if got, err := m.Get(name); err != nil || got != value {
			t.Fatalf("Get(%q) = %q, %v; want the value stored", name, got, err)
		}
		up, err := m.Update(ctx, info.ID, value+"2", nil)
		if err != nil || up.Version != 2 || len(up.Metadata) != len(info.Metadata) {
			t.Fatalf("Update: %+v, %v (created %+v)", up, err, info)
		}
		if got, _ := m.Get(name); got != value+"2" {
			t.Fatalf("after update: %q", got)
		}
	})
}
