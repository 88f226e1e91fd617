package secrets

import (
	"fmt"
	"strings"

	"github.com/cella-sandbox/cella/internal/errdefs"
)

// The placeholders Expand replaces: E2B's, as its SDK's Secret.fill writes
// it, and cella's shorter alias.
const (
	PlaceholderPrefix = "${e2b.secrets."
	AliasPrefix       = "${secret:"
)

// Placeholder returns E2B's placeholder for the secret name.
func Placeholder(name string) string { return PlaceholderPrefix + name + "}" }

// Expand replaces every ${e2b.secrets.NAME} and ${secret:NAME} in s with
// the value get returns for NAME, in one pass: a value that itself looks
// like a placeholder is not expanded again. It also returns the names used,
// each once, in order of first use, so the caller can redact them.
//
// A placeholder that is not closed, names no valid secret name, or names a
// secret get does not know is an error naming the placeholder, never a
// value: sending the text on half-expanded would leak the template and lose
// the credential.
func Expand(s string, get func(name string) (string, error)) (string, []string, error) {
	var names []string
	seen := map[string]bool{}
	out, err := Replace(s, func(prefix, name string) (string, error) {
		if get == nil {
			return "", errdefs.NotFound("placeholder %s%s}: no secrets are available here", prefix, name)
		}
		v, err := get(name)
		if err != nil {
			if errdefs.Is(err, errdefs.KindNotFound) {
				return "", errdefs.NotFound("placeholder %s%s}: unknown secret %q", prefix, name, name)
			}
			return "", fmt.Errorf("placeholder %s%s}: look up secret %q: %w", prefix, name, name, err)
		}
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
		return v, nil
	})
	if err != nil {
		return "", nil, err
	}
	return out, names, nil
}

// Names returns the secret names the placeholders of s use, each once, in
// order of first use; nil when s has none. A placeholder that is not closed
// or names no valid secret name is Replace's error, with no names.
func Names(s string) ([]string, error) {
	var names []string
	seen := map[string]bool{}
	_, err := Replace(s, func(_, name string) (string, error) {
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
		return "", nil
	})
	if err != nil {
		return nil, err
	}
	return names, nil
}

// Replace puts what fn returns for each placeholder of s in its place, in
// one pass, and returns fn's first error as it is. A placeholder that is
// not closed or names no valid secret name is an InvalidArgument error.
// It is the one parser of placeholders: Expand (environment variables) and
// the egress proxy's header rules both use it.
func Replace(s string, fn func(prefix, name string) (string, error)) (string, error) {
	var b strings.Builder
	replaced := false
	for {
		i, prefix := nextPlaceholder(s)
		if i < 0 {
			break
		}
		rest := s[i+len(prefix):]
		end := strings.IndexByte(rest, '}')
		if end < 0 {
			return "", errdefs.InvalidArgument("placeholder %s… is not closed with '}'", prefix)
		}
		name := rest[:end]
		if !nameRe.MatchString(name) {
			return "", errdefs.InvalidArgument("placeholder %s…} holds %s, which is not a secret name: names are 1-128 letters, digits, '_', '.' and '-'", prefix, quoteName(name))
		}
		v, err := fn(prefix, name)
		if err != nil {
			return "", err
		}
		replaced = true
		b.WriteString(s[:i])
		b.WriteString(v)
		s = rest[end+1:]
	}
	if !replaced {
		return s, nil
	}
	b.WriteString(s)
	return b.String(), nil
}

// nextPlaceholder finds the first placeholder of either form in s.
func nextPlaceholder(s string) (int, string) {
	i, prefix := strings.Index(s, PlaceholderPrefix), PlaceholderPrefix
	if j := strings.Index(s, AliasPrefix); j >= 0 && (i < 0 || j < i) {
		i, prefix = j, AliasPrefix
	}
	return i, prefix
}
