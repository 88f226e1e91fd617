package api

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cella-sandbox/cella/internal/sandbox"
)

// TestMaskRequestHost: network.maskRequestHost is kept as asked when it is
// an ASCII host (with ${PORT} and an optional port), and refused with a
// message naming the field otherwise: it becomes a Host header, so nothing
// that could split or fold one passes.
func TestMaskRequestHost(t *testing.T) {
	for _, mask := range []string{"${PORT}-app.internal", "app.internal:8080", "${PORT}-x.example:${PORT}", "localhost", "10.0.0.1:80", "[::1]:3000"} {
		raw, _ := json.Marshal(map[string]string{"maskRequestHost": mask})
		got, err := maskRequestHostFor(raw)
		if err != nil || got != mask {
			t.Errorf("%q: %q %v", mask, got, err)
		}
	}
	for _, mask := range []string{"bad host", "a\r\nX-Injected: 1", "host/path", "héllo.example", "h:port", "h:", "-lead.example", "a@b"} {
		raw, _ := json.Marshal(map[string]string{"maskRequestHost": mask})
		if got, err := maskRequestHostFor(raw); err == nil || !strings.Contains(err.Error(), "maskRequestHost") {
			t.Errorf("%q: accepted as %q (%v)", mask, got, err)
		}
	}
	if got, err := maskRequestHostFor(json.RawMessage(`{"allowPublicTraffic":false}`)); got != "" || err != nil {
		t.Errorf("unset: %q %v", got, err)
	}
}

// TestSecureFalseHidesToken: a sandbox created with secure: false answers
// envdAccessToken null, as E2B's; a secure one its token.
func TestSecureFalseHidesToken(t *testing.T) {
	in := sandbox.Info{EnvdAccessToken: "tok"}
	if p := envdTokenPtr(in); p == nil || *p != "tok" {
		t.Fatalf("secure: %v", p)
	}
	in.Options.Insecure = true
	b, _ := json.Marshal(sandboxResponse{EnvdAccessToken: envdTokenPtr(in)})
	if !strings.Contains(string(b), `"envdAccessToken":null`) {
		t.Fatalf("insecure: %s", b)
	}
}
