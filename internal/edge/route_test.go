package edge

import (
	"encoding/json"
	"net"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestTarget(t *testing.T) {
	for _, c := range []struct {
		host, id, port, domain string
		want                   Target
		traffic                bool
		err                    string
	}{
		// E2B's headers with a generic host.
		{"127.0.0.1:3000", "abc123", "49983", "cella.test", Target{"abc123", 49983}, true, ""},
		{"localhost", "abc", "8080", "", Target{"abc", 8080}, true, ""},
		{"[::1]:3000", "abc", "1", "", Target{"abc", 1}, true, ""},
		{"sandbox.cella.test", "abc", "80", "cella.test", Target{"abc", 80}, true, ""},
		{"127.0.0.1", "abc", "", "", Target{}, true, "missing header"},
		{"127.0.0.1", "", "80", "", Target{}, true, "missing header"},
		{"127.0.0.1", "a-b", "80", "", Target{}, true, "Invalid sandbox ID"},
		{"127.0.0.1", "ABC", "80", "", Target{}, true, "Invalid sandbox ID"},
		{"127.0.0.1", "abc", "8o", "", Target{}, true, "Invalid sandbox port"},
		{"127.0.0.1", "abc", "65536", "", Target{}, true, "Invalid sandbox port"},
		// The headers on a host that is not generic are not routing.
		{"evil.test", "abc", "80", "cella.test", Target{}, false, ""},
		// Host <port>-<id>.<domain>.
		{"8080-abc123.cella.test", "", "", "cella.test", Target{"abc123", 8080}, true, ""},
		{"8080-ABC123.Cella.Test.:3000", "", "", "cella.test", Target{"abc123", 8080}, true, ""},
		{"0-abc.cella.test", "", "", "cella.test", Target{}, true, "Invalid sandbox port"},
		{"80-a_b.cella.test", "", "", "cella.test", Target{}, true, "Invalid sandbox ID"},
		{"80-a.b.cella.test", "", "", "cella.test", Target{}, false, ""},
		{"cella.test", "", "", "cella.test", Target{}, false, ""},
		{"80-abc.evil.test", "", "", "cella.test", Target{}, false, ""},
		{"80-abc.cella.test", "", "", "", Target{}, false, ""},
		// The API itself.
		{"127.0.0.1:3000", "", "", "cella.test", Target{}, false, ""},
	} {
		r := httptest.NewRequest("GET", "/health", nil)
		r.Host = c.host
		if c.id != "" {
			r.Header.Set(hdrSandboxID, c.id)
		}
		if c.port != "" {
			r.Header.Set(hdrSandboxPort, c.port)
		}
		got, ok, err := target(r, c.domain)
		errS := ""
		if err != nil {
			errS = err.Error()
		}
		if got != c.want || ok != c.traffic || errS != c.err {
			t.Errorf("Host %q headers %q %q domain %q: %+v %v %q, want %+v %v %q", c.host, c.id, c.port, c.domain, got, ok, errS, c.want, c.traffic, c.err)
		}
	}
}

// FuzzSandboxTarget: the routing of sandbox traffic (E2B's headers with a
// generic Host, or Host <port>-<id>.<domain>) yields a valid port and ID
// or a 400, and never takes an API request for sandbox traffic.
func FuzzSandboxTarget(f *testing.F) {
	for _, s := range [][3]string{
		{"127.0.0.1:3000", "abc123", "49983"}, {"localhost", "abc", "8080"}, {"[::1]:3000", "abc", "1"},
		{"sandbox.cella.test", "abc", "80"}, {"8080-abc123.cella.test", "", ""}, {"8080-abc123.cella.test.:3000", "", ""},
		{"0-abc.cella.test", "", ""}, {"65536-abc.cella.test", "", ""}, {"80-ABC.cella.test", "", ""}, {"80-a.b.cella.test", "", ""},
		{"cella.test", "", ""}, {"127.0.0.1", "abc", ""}, {"127.0.0.1", "", "80"}, {"127.0.0.1", "a-b", "80"},
		{"127.0.0.1", "abc", "+80"}, {"evil.test", "abc", "80"}, {"80-abc.evil.test", "", ""}, {"", "", ""},
	} {
		f.Add(s[0], s[1], s[2], "cella.test")
		f.Add(s[0], s[1], s[2], "")
	}
	idRe := regexp.MustCompile(`^[a-z0-9]+$`)
	f.Fuzz(func(t *testing.T, host, id, port, domain string) {
		r := httptest.NewRequest("GET", "/health", nil)
		r.Host = host
		if id != "" {
			r.Header.Set(hdrSandboxID, id)
		}
		if port != "" {
			r.Header.Set(hdrSandboxPort, port)
		}
		tg, ok, err := target(r, domain)
		if !ok || err != nil {
			if err != nil && !ok {
				t.Fatalf("an error (%v) for a request that is not sandbox traffic", err)
			}
			return
		}
		if tg.Port < 1 || tg.Port > 65535 || !idRe.MatchString(tg.ID) {
			t.Fatalf("Host %q, headers %q %q routed to %+v", host, id, port, tg)
		}
		h := strings.TrimSuffix(strings.ToLower(host), ".")
		if hp, _, err := net.SplitHostPort(h); err == nil {
			h = strings.TrimSuffix(hp, ".")
		}
		if id == "" && port == "" && (domain == "" || !strings.HasSuffix(h, "."+strings.ToLower(domain))) {
			t.Fatalf("Host %q (domain %q) without routing headers taken for sandbox traffic: %+v", host, domain, tg)
		}
	})
}

// TestBadTargetIsJSON: a request that is sandbox traffic but names no
// valid target is answered by the edge in the JSON error shape, never
// net/http's text/plain.
func TestBadTargetIsJSON(t *testing.T) {
	p := New(Config{Domain: "cella.test"})
	for _, hdr := range []map[string]string{
		{"E2b-Sandbox-Id": "abc"},
		{"E2b-Sandbox-Id": "ABC", "E2b-Sandbox-Port": "80"},
		{"E2b-Sandbox-Id": "abc", "E2b-Sandbox-Port": "0"},
	} {
		r := httptest.NewRequest("GET", "http://127.0.0.1:3000/health", nil)
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		if !p.Handle(w, r) {
			t.Fatalf("%v: not handled as sandbox traffic", hdr)
		}
		var body errorBody
		if w.Code != 400 || !strings.HasPrefix(w.Header().Get("Content-Type"), "application/json") ||
			json.Unmarshal(w.Body.Bytes(), &body) != nil || body.Code != 400 || body.Message == "" {
			t.Errorf("%v: %d %q %s, want a 400 JSON {code, message}", hdr, w.Code, w.Header().Get("Content-Type"), w.Body)
		}
	}
}
