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
	var b strings.Builder
	var names []string
	seen := map[string]bool{}
	for {
		i, prefix := nextPlaceholder(s)
		if i < 0 {
			break
		}
		rest := s[i+len(prefix):]
		end := strings.IndexByte(rest, '}')
		if end < 0 {
			return "", nil, errdefs.InvalidArgument("placeholder %s… is not closed with '}'", prefix)
		}
		name := rest[:end]
		if !nameRe.MatchString(name) {
			return "", nil, errdefs.InvalidArgument("placeholder %s…} holds %s, which is not a secret name: names are 1-128 letters, digits, '_', '.' and '-'", prefix, quoteName(name))
		}
		if get == nil {
			return "", nil, errdefs.NotFound("placeholder %s%s}: no secrets are available here", prefix, name)
		}
		v, err := get(name)
		if err != nil {
			if errdefs.Is(err, errdefs.KindNotFound) {
				return "", nil, errdefs.NotFound("placeholder %s%s}: unknown secret %q", prefix, name, name)
			}
			return "", nil, fmt.Errorf("placeholder %s%s}: look up secret %q: %w", prefix, name, name, err)
		}
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
		b.WriteString(s[:i])
		b.WriteString(v)
		s = rest[end+1:]
	}
	if names == nil {
		return s, nil, nil
	}
	b.WriteString(s)
	return b.String(), names, nil
}

// nextPlaceholder finds the first placeholder of either form in s.
func nextPlaceholder(s string) (int, string) {
	i, prefix := strings.Index(s, PlaceholderPrefix), PlaceholderPrefix
	if j := strings.Index(s, AliasPrefix); j >= 0 && (i < 0 || j < i) {
		i, prefix = j, AliasPrefix
	}
	return i, prefix
}
