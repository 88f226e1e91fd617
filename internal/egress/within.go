package egress

import (
	"maps"
	"slices"
)

// Within returns the part of p that ceiling allows, for a policy that was
// made under another, wider ceiling (a sandbox forked or restored by a key
// with a smaller one): every allowOut entry of p that a ceiling entry
// covers, and every ceiling entry that an entry of p covers ("*" within a
// ceiling of "github.com" is "github.com"); denyOut is the union; rules are
// p's, with the ceiling's taking over a host both name. Unlike Narrow it
// drops what does not fit instead of refusing it.
func (p Policy) Within(ceiling Policy) (Policy, error) {
	req, err := compileStrict(p)
	if err != nil {
		return Policy{}, err
	}
	ceil, err := compileStrict(ceiling)
	if err != nil {
		return Policy{}, err
	}
	var allow []string
	for _, e := range req.allow {
		if ceil.covers(e) {
			allow = append(allow, e.text)
		}
	}
	for _, ce := range ceil.allow {
		if (&compiledPolicy{allow: req.allow}).covers(ce) && !slices.Contains(allow, ce.text) {
			allow = append(allow, ce.text)
		}
	}
	out := Policy{AllowOut: allow, DenyOut: union(entryTexts(ceil.deny), entryTexts(req.deny))}
	if len(p.Rules)+len(ceiling.Rules) > 0 {
		out.Rules = maps.Clone(p.Rules)
		if out.Rules == nil {
			out.Rules = map[string][]Rule{}
		}
		maps.Copy(out.Rules, ceiling.Rules)
	}
	return out, nil
}
