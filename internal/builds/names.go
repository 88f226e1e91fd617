package builds

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/cella-sandbox/cella/internal/errdefs"
)

// E2B's name rules (INFRA packages/shared/pkg/id/id.go; spec §8.2).
var (
	aliasRE = regexp.MustCompile(`^[a-z0-9-_]+$`)
	tagRE   = regexp.MustCompile(`^[a-z0-9-_.]+$`)
	uuidRE  = regexp.MustCompile(`^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$`)
	hashRE  = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// DefaultTag is the tag of a build requested without one.
const DefaultTag = "default"

// MaxNameLength bounds a template name (E2B's TemplateBuildRequestV3).
const MaxNameLength = 128

// Name is E2B's "namespace/alias:tag" (namespace and tag optional).
type Name struct {
	Namespace string
	Alias     string
	// Tag is "" when none was given (":default" counts as none).
	Tag string
}

func (n Name) String() string {
	s := n.Alias
	if n.Namespace != "" {
		s = n.Namespace + "/" + s
	}
	if n.Tag != "" {
		s += ":" + n.Tag
	}
	return s
}

// TagOr is the name's tag, or def without one.
func (n Name) TagOr(def string) string {
	if n.Tag == "" {
		return def
	}
	return n.Tag
}

func invalidName(raw, why string) error {
	return errdefs.InvalidArgument("Invalid template name %q: %s (an alias is a-z, 0-9, - and _, up to %d characters; "+
		"optionally namespace/alias and :tag, a tag being a-z, 0-9, -, _ and .)", raw, why, MaxNameLength)
}

// ParseName reads a template name as E2B does: trimmed, lower-cased,
// "alias", "alias:tag", "namespace/alias[:tag]".
func ParseName(raw string) (Name, error) {
	s := strings.ToLower(strings.TrimSpace(raw))
	if s == "" {
		return Name{}, invalidName(raw, "it is empty")
	}
	if len(s) > MaxNameLength {
		return Name{}, invalidName(raw, fmt.Sprintf("it is longer than %d characters", MaxNameLength))
	}
	var n Name
	rest := s
	if ns, a, ok := strings.Cut(s, "/"); ok {
		if !aliasRE.MatchString(ns) {
			return Name{}, invalidName(raw, "bad namespace")
		}
		n.Namespace, rest = ns, a
	}
	alias, tag, hasTag := strings.Cut(rest, ":")
	if !aliasRE.MatchString(alias) {
		return Name{}, invalidName(raw, "bad alias")
	}
	n.Alias = alias
	if hasTag {
		if err := checkTag(tag); err != nil {
			return Name{}, invalidName(raw, err.Error())
		}
		if tag != DefaultTag {
			n.Tag = tag
		}
	}
	return n, nil
}

// checkTag says what is wrong with a tag.
func checkTag(tag string) error {
	switch {
	case !tagRE.MatchString(tag):
		return fmt.Errorf("bad tag %q", tag)
	case uuidRE.MatchString(tag):
		return fmt.Errorf("tag %q looks like a build ID, which a tag may not", tag)
	}
	return nil
}

// validTags checks tags (lower-cased, trimmed) and returns them de-duplicated,
// in order.
func validTags(tags []string) ([]string, error) {
	var out []string
	for _, t := range tags {
		t = strings.ToLower(strings.TrimSpace(t))
		if err := checkTag(t); err != nil {
			return nil, errdefs.InvalidArgument("Invalid tag: %v (a tag is a-z, 0-9, -, _ and .)", err)
		}
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out, nil
}

// newBuildID is a random (version 4) UUID, E2B's build IDs.
func newBuildID() string {
	return uuid.NewString()
}

// storeNamePrefix starts the template-store name of every API build: "." is
// not allowed in an alias, so no alias can be one.
const storeNamePrefix = "e2b."

// storeName is the template-store name a build installs: one per build,
// since tags point at builds.
func storeName(templateID, buildID string) string {
	return storeNamePrefix + templateID + "." + buildID
}

// IsStoreName reports whether a template-store name is an API build's.
func IsStoreName(name string) bool { return strings.HasPrefix(name, storeNamePrefix) }
