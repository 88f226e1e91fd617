package egress

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestValidateNamesBadEntries(t *testing.T) {
	for _, tc := range []struct {
		p    Policy
		want string
	}{
		{Policy{AllowOut: []string{"foo bar"}}, `allowOut entry "foo bar": not an IP, CIDR or domain name`},
		{Policy{AllowOut: []string{"10.0.0.0/33"}}, `allowOut entry "10.0.0.0/33": not a valid CIDR`},
		{Policy{AllowOut: []string{"*.*.pkg.test"}}, `allowOut entry "*.*.pkg.test": a wildcard is only allowed`},
		{Policy{AllowOut: []string{"a.*.test"}}, `allowOut entry "a.*.test"`},
		{Policy{AllowOut: []string{"bücher.test"}}, `punycode`},
		{Policy{AllowOut: []string{"169.254.169.254"}}, `allowOut entry "169.254.169.254": inside 169.254.0.0/16`},
		{Policy{AllowOut: []string{""}}, `allowOut entry "": empty entry`},
		{Policy{DenyOut: []string{"-bad-.test"}}, `denyOut entry "-bad-.test"`},
		{Policy{Rules: map[string][]Rule{"10.0.0.1": {{}}}}, `rules key "10.0.0.1": rules apply to host names`},
		{Policy{Rules: map[string][]Rule{"api.test": {{Transform: &Transform{Headers: map[string]string{"Bad Name": "x"}}}}}}, `header "Bad Name": not a valid header name`},
		{Policy{Rules: map[string][]Rule{"api.test": {{Transform: &Transform{Headers: map[string]string{"content-length": "1"}}}}}}, `cannot set a header that frames`},
		{Policy{Rules: map[string][]Rule{"api.test": {{Transform: &Transform{Headers: map[string]string{"Authorization": "Bearer ${secret:TOK"}}}}}}, `malformed ${e2b.secrets.NAME}`},
		{Policy{Rules: map[string][]Rule{"api.test": {{Transform: &Transform{Headers: map[string]string{"X-A": "a\r\nX-B: b"}}}}}}, `characters not allowed`},
	} {
		err := tc.p.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want it to contain %q", tc.p, err, tc.want)
		}
	}
	ok := Policy{
		AllowOut: []string{"pkg.test", "*.github.com", "*", "10.0.0.0/8", "1.1.1.1", "0.0.0.0/0", "Mixed.Case.Test."},
		DenyOut:  []string{"evil.test", "10.9.0.0/16"},
		Rules:    map[string][]Rule{"*.api.test": {{Transform: &Transform{Headers: map[string]string{"Authorization": "Bearer ${secret:TOKEN}"}}}}},
	}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate(valid policy) = %v", err)
	}
}

func TestValidateReportsEveryBadEntry(t *testing.T) {
	err := Policy{AllowOut: []string{"a b", "pkg.test", "c d"}}.Validate()
	if err == nil || !strings.Contains(err.Error(), `"a b"`) || !strings.Contains(err.Error(), `"c d"`) {
		t.Fatalf("Validate = %v, want both bad entries named", err)
	}
}

func TestAllowsHost(t *testing.T) {
	p := Policy{
		AllowOut: []string{"pkg.test", "*.github.test", "*.deep.github.test", "10.0.0.0/8"},
		DenyOut:  []string{"evil.github.test"},
	}
	for _, tc := range []struct {
		name string
		ok   bool
		rule string
	}{
		{"pkg.test", true, "pkg.test"},
		{"PKG.test.", true, "pkg.test"},
		{"sub.pkg.test", false, "no-match"},
		{"api.github.test", true, "*.github.test"},
		{"a.deep.github.test", true, "*.deep.github.test"},
		{"github.test", false, "no-match"}, // a wildcard is not its apex
		{"evil.github.test", false, "evil.github.test"},
		{"10.1.2.3", true, "10.0.0.0/8"}, // an address literal is an address
		{"bad..name", false, "invalid-name"},
	} {
		ok, rule := p.AllowsHost(tc.name)
		if ok != tc.ok || rule != tc.rule {
			t.Errorf("AllowsHost(%q) = %v, %q; want %v, %q", tc.name, ok, rule, tc.ok, tc.rule)
		}
	}
	if ok, _ := (Policy{AllowOut: []string{"*"}}).AllowsHost("anything.invalid"); !ok {
		t.Error(`"*" does not allow any domain`)
	}
	// An address with a trailing dot is the address, as the proxy reads it:
	// "*" (any name) does not allow it.
	if ok, rule := (Policy{AllowOut: []string{"*"}}).AllowsHost("1.2.3.4."); ok {
		t.Errorf(`"*" allows the address 1.2.3.4. (rule %q)`, rule)
	}
	if ok, _ := (Policy{AllowOut: []string{"*"}, DenyOut: []string{"evil.test"}}).AllowsHost("evil.test"); ok {
		t.Error("deny does not win over allow")
	}
	if ok, rule := (Policy{AllowOut: []string{"0.0.0.0/0"}}).AllowsHost("pkg.test"); ok {
		t.Errorf("an IP-only policy allows a name (rule %q)", rule)
	}
	if ok, _ := (Policy{}).AllowsHost("pkg.test"); ok {
		t.Error("the empty policy allows a name")
	}
	if ok, rule := (Policy{AllowOut: []string{"bad entry", "pkg.test"}}).AllowsHost("pkg.test"); ok || rule != "invalid-policy" {
		t.Errorf("an invalid policy allows: %v %q", ok, rule)
	}
}

func TestAllowsAddr(t *testing.T) {
	for _, tc := range []struct {
		p    Policy
		addr string
		ok   bool
		rule string
	}{
		{Policy{}, "1.1.1.1", false, "no-match"},
		{Policy{AllowOut: []string{"1.1.1.1"}}, "1.1.1.1", true, "1.1.1.1"},
		{Policy{AllowOut: []string{"10.0.0.0/8", "10.1.0.0/16"}}, "10.1.2.3", true, "10.1.0.0/16"},
		{Policy{AllowOut: []string{"10.0.0.0/8"}, DenyOut: []string{"10.1.0.0/16"}}, "10.1.2.3", false, "10.1.0.0/16"},
		{Policy{AllowOut: []string{"10.1.0.0/16"}, DenyOut: []string{"10.0.0.0/8"}}, "10.1.2.3", false, "10.0.0.0/8"},
		// E2B's idiom: the catch-all deny restates the default.
		{Policy{AllowOut: []string{"1.1.1.1"}, DenyOut: []string{"0.0.0.0/0"}}, "1.1.1.1", true, "1.1.1.1"},
		{Policy{AllowOut: []string{"1.1.1.1"}, DenyOut: []string{"0.0.0.0/0"}}, "8.8.8.8", false, "0.0.0.0/0"},
		{Policy{AllowOut: []string{"0.0.0.0/0"}}, "169.254.169.254", false, "hard-deny:169.254.0.0/16"},
		{Policy{AllowOut: []string{"0.0.0.0/0"}}, "224.0.0.1", false, "hard-deny:224.0.0.0/4"},
		{Policy{AllowOut: []string{"0.0.0.0/0"}}, "255.255.255.255", false, "hard-deny:240.0.0.0/4"},
		{Policy{AllowOut: []string{"0.0.0.0/0"}}, "198.18.0.5", false, "hard-deny:198.18.0.0/15"},
		{Policy{AllowOut: []string{"0.0.0.0/0"}}, "0.1.2.3", false, "hard-deny:0.0.0.0/8"},
		{Policy{AllowOut: []string{"0.0.0.0/0"}}, "::ffff:169.254.169.254", false, "hard-deny:169.254.0.0/16"},
		{Policy{AllowOut: []string{"*"}}, "1.1.1.1", false, "no-match"},
	} {
		ok, rule := tc.p.AllowsAddr(netip.MustParseAddr(tc.addr))
		if ok != tc.ok || rule != tc.rule {
			t.Errorf("%+v.AllowsAddr(%s) = %v, %q; want %v, %q", tc.p, tc.addr, ok, rule, tc.ok, tc.rule)
		}
	}
}

func TestNarrow(t *testing.T) {
	ceiling := Policy{AllowOut: []string{"pkg.test", "*.github.test", "10.0.0.0/8"}, DenyOut: []string{"10.9.0.0/16"}}

	got, err := Policy{AllowOut: []string{"api.github.test", "*.x.github.test", "10.1.0.0/16", "pkg.test"}, DenyOut: []string{"bad.github.test"}}.Narrow(ceiling)
	if err != nil {
		t.Fatalf("Narrow(inside) = %v", err)
	}
	if strings.Join(got.AllowOut, ",") != "api.github.test,*.x.github.test,10.1.0.0/16,pkg.test" {
		t.Errorf("AllowOut = %v", got.AllowOut)
	}
	if strings.Join(got.DenyOut, ",") != "10.9.0.0/16,bad.github.test" {
		t.Errorf("DenyOut = %v, want the union", got.DenyOut)
	}

	for _, entry := range []string{"evil.test", "github.test", "*.test", "*", "11.0.0.0/8", "0.0.0.0/0"} {
		_, err := Policy{AllowOut: []string{"pkg.test", entry}}.Narrow(ceiling)
		var oce *OutsideCeilingError
		if !errors.As(err, &oce) || oce.Entry != entry {
			t.Errorf("Narrow(%q) = %v, want *OutsideCeilingError for it", entry, err)
			continue
		}
		if !strings.Contains(err.Error(), entry) || !strings.Contains(err.Error(), "pkg.test, *.github.test, 10.0.0.0/8") {
			t.Errorf("error %q does not name the entry and the ceiling", err)
		}
	}

	got, err = Policy{AllowInternet: true}.Narrow(ceiling)
	if err != nil || strings.Join(got.AllowOut, ",") != "pkg.test,*.github.test,10.0.0.0/8" {
		t.Errorf("allow_internet without entries = %v, %v; want the ceiling's list", got.AllowOut, err)
	}
	got, err = Policy{}.Narrow(ceiling)
	if err != nil || len(got.AllowOut) != 0 {
		t.Errorf("no entries, no internet = %v, %v; want no egress", got.AllowOut, err)
	}
	if ok, _ := got.AllowsHost("pkg.test"); ok {
		t.Error("no entries, no internet allows pkg.test")
	}

	// The default ceiling is empty: no egress, whatever the request says.
	got, err = Policy{AllowInternet: true}.Narrow(Policy{})
	if err != nil || len(got.AllowOut) != 0 || got.Summary() != "allowed: nothing (no egress)" {
		t.Errorf("default ceiling = %+v, %v", got, err)
	}
	_, err = Policy{AllowOut: []string{"pkg.test"}}.Narrow(Policy{})
	var oce *OutsideCeilingError
	if !errors.As(err, &oce) || !strings.Contains(err.Error(), "allows no egress") {
		t.Errorf("request under the empty ceiling = %v", err)
	}

	// "*" covers any domain, never an address.
	if _, err := (Policy{AllowOut: []string{"*.anything.test", "x.test"}}).Narrow(Policy{AllowOut: []string{"*"}}); err != nil {
		t.Errorf(`"*" ceiling: %v`, err)
	}

	// The operator's header rules cannot be replaced by a request.
	op := Policy{AllowOut: []string{"*"}, Rules: map[string][]Rule{"api.test": {{Transform: &Transform{Headers: map[string]string{"Authorization": "op"}}}}}}
	got, err = Policy{AllowInternet: true, Rules: map[string][]Rule{
		"api.test":   {{Transform: &Transform{Headers: map[string]string{"Authorization": "req"}}}},
		"other.test": {{Transform: &Transform{Headers: map[string]string{"X-A": "b"}}}},
	}}.Narrow(op)
	if err != nil || got.Rules["api.test"][0].Transform.Headers["Authorization"] != "op" || got.Rules["other.test"] == nil {
		t.Errorf("rules = %+v, %v", got.Rules, err)
	}

	if _, err := (Policy{AllowOut: []string{"bad entry"}}).Narrow(ceiling); err == nil || !strings.Contains(err.Error(), "bad entry") {
		t.Errorf("invalid request = %v", err)
	}
}

func TestSummary(t *testing.T) {
	if s := (Policy{AllowOut: []string{"pkg.test", "*.github.com", "10.0.0.0/8"}}).Summary(); s != "allowed: pkg.test, *.github.com, 10.0.0.0/8" {
		t.Errorf("Summary = %q", s)
	}
	if s := (Policy{}).Summary(); s != "allowed: nothing (no egress)" {
		t.Errorf("Summary = %q", s)
	}
	if s := (Policy{AllowOut: []string{"*"}, DenyOut: []string{"evil.test"}}).Summary(); s != "allowed: *; denied: evil.test" {
		t.Errorf("Summary = %q", s)
	}
}

func TestParsePolicy(t *testing.T) {
	p, err := ParsePolicy([]byte(`{"allowOut":["pkg.test","*.github.test"],"denyOut":["0.0.0.0/0"],"allowPublicTraffic":false,
		"rules":{"api.test":[{"transform":{"headers":{"Authorization":"Bearer ${secret:TOKEN}"}}}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.AllowOut) != 2 || p.DenyOut[0] != "0.0.0.0/0" || p.Rules["api.test"][0].Transform.Headers["Authorization"] != "Bearer ${secret:TOKEN}" {
		t.Errorf("ParsePolicy = %+v", p)
	}
	if p, err := ParsePolicy(nil); err != nil || len(p.AllowOut) != 0 {
		t.Errorf("ParsePolicy(nil) = %+v, %v", p, err)
	}
	if _, err := ParsePolicy([]byte(`{"allowOut":["no way"]}`)); err == nil || !strings.Contains(err.Error(), `"no way"`) {
		t.Errorf("ParsePolicy(bad entry) = %v", err)
	}
	if _, err := ParsePolicy([]byte(`[1]`)); err == nil {
		t.Error("ParsePolicy(array) succeeded")
	}
}

// TestInvalidPolicyAllowsNothing: the exported checks of a policy that does
// not validate allow nothing and say why.
func TestInvalidPolicyAllowsNothing(t *testing.T) {
	bad := Policy{AllowOut: []string{"bad entry", "0.0.0.0/0"}}
	if ok, rule := bad.AllowsAddr(netip.MustParseAddr("1.1.1.1")); ok || rule != "invalid-policy" {
		t.Errorf("AllowsAddr = %v, %q", ok, rule)
	}
	want := `allowed: nothing (the policy is invalid: egress: allowOut entry "bad entry": not an IP, CIDR or domain name)`
	if s := bad.Summary(); s != want {
		t.Errorf("Summary = %q, want %q", s, want)
	}
}

// TestInjectionFor: the headers of the most specific matching key, by
// canonical name, sorted, computed once at compile time; later rules win,
// and names of one transform differing only in case resolve the same way
// every time (byte order, the last wins). A rule applies to https on 443
// unless it says otherwise, and only there.
func TestInjectionFor(t *testing.T) {
	c, err := compileStrict(Policy{Rules: map[string][]Rule{
		"*":          {{Transform: &Transform{Headers: map[string]string{"x-any": "1"}}}},
		"*.api.test": {{Transform: &Transform{Headers: map[string]string{"X-Wild": "2"}}}},
		"a.api.test": {
			{Transform: &Transform{Headers: map[string]string{"authorization": "first", "x-b": "b"}}},
			{},
			{Transform: &Transform{Headers: map[string]string{"Authorization": "second", "x-api-key": "lower", "X-API-KEY": "upper", "X-Api-Key": "canonical"}}},
			{Transform: &Transform{Headers: map[string]string{"X-Plain": "p"}}, Scheme: "http", Port: 8080},
			{Transform: &Transform{Headers: map[string]string{"X-Alt": "a"}}, Port: 8443},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		in := c.injectionFor("a.api.test", "https", 443)
		if !slices.Equal(in.names, []string{"Authorization", "X-Api-Key", "X-B"}) ||
			!maps.Equal(in.hdrs, map[string]string{"Authorization": "second", "X-Api-Key": "lower", "X-B": "b"}) || in.refused() {
			t.Fatalf("round %d: injectionFor(a.api.test) = %+v", i, in)
		}
	}
	n1 := c.injectionFor("a.api.test", "https", 443).names
	n2 := c.injectionFor("a.api.test", "https", 443).names
	if &n1[0] != &n2[0] {
		t.Error("injectionFor builds its answer per call")
	}
	if in := c.injectionFor("a.api.test", "http", 8080); !slices.Equal(in.names, []string{"X-Plain"}) {
		t.Errorf("http:8080 = %+v", in)
	}
	if in := c.injectionFor("a.api.test", "https", 8443); !slices.Equal(in.names, []string{"X-Alt"}) {
		t.Errorf("https:8443 = %+v", in)
	}
	// Where no rule of the key is bound: refused, naming where they are.
	for _, b := range []binding{{"http", 80}, {"http", 443}, {"https", 80}, {"https", 8080}} {
		in := c.injectionFor("a.api.test", b.scheme, b.port)
		if !in.refused() || in.key != "a.api.test" || fmt.Sprint(in.bound) != "[https on port 443 https on port 8443 http on port 8080]" {
			t.Errorf("%v: %+v", b, in)
		}
	}
	if in := c.injectionFor("b.api.test", "https", 443); !slices.Equal(in.names, []string{"X-Wild"}) || in.hdrs["X-Wild"] != "2" {
		t.Errorf("injectionFor(b.api.test) = %+v", in)
	}
	if in := c.injectionFor("other.test", "https", 443); !slices.Equal(in.names, []string{"X-Any"}) || in.hdrs["X-Any"] != "1" {
		t.Errorf("injectionFor(other.test) = %+v", in)
	}
	if in := c.injectionFor("other.test", "http", 80); !in.refused() || in.key != "*" {
		t.Errorf("injectionFor(other.test, http) = %+v", in)
	}
	c, _ = compileStrict(Policy{Rules: map[string][]Rule{"api.test": {{}}}})
	if in := c.injectionFor("api.test", "http", 80); in.names != nil || in.refused() {
		t.Errorf("a rule without transform: %+v", in)
	}
	if in := c.injectionFor("other.test", "https", 443); in.names != nil || in.refused() {
		t.Errorf("no matching key: %+v", in)
	}
	for _, r := range []Rule{{Scheme: "ftp"}, {Port: -1}, {Port: 65536}} {
		if _, err := compileStrict(Policy{Rules: map[string][]Rule{"api.test": {r}}}); err == nil {
			t.Errorf("rule %+v accepted", r)
		}
	}
}

// TestCheckHeaderBytes: a rule's header name is an RFC 9110 token and its
// value has no control character but tab, byte by byte.
func TestCheckHeaderBytes(t *testing.T) {
	const tchar = "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	for b := range 256 {
		c := string([]byte{byte(b)})
		nameOK := strings.Contains(tchar, c)
		if err := checkHeader("X-"+c, "v"); (err == nil) != nameOK {
			t.Errorf("name %q: %v", "X-"+c, err)
		}
		valueOK := b >= 0x20 && b != 0x7f || b == '\t'
		if err := checkHeader("X-V", "a"+c+"b"); (err == nil) != valueOK {
			t.Errorf("value byte %#x: %v", b, err)
		}
	}
	if err := checkHeader("", "v"); err == nil || err.Error() != "not a valid header name" {
		t.Errorf("empty name: %v", err)
	}
	if err := checkHeader("X-Ü", "v"); err == nil {
		t.Error("a non-ASCII name is accepted")
	}
	if err := checkHeader("X-V", "Bearer ${secret:TOK"); err == nil || !strings.HasPrefix(err.Error(), "malformed ${e2b.secrets.NAME} reference: ") {
		t.Errorf("unclosed reference: %v", err)
	}
	if err := checkHeader("X-V", "Bearer ${secret:TOK} ${e2b.secrets.X}"); err != nil {
		t.Errorf("good references: %v", err)
	}
}
