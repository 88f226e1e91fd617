package gatewayauth_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/gatewayauth"
)

// TestVerify: a signed request verifies as its key; every change of what
// the MAC covers, another secret, a stale time or a missing part is
// refused.
func TestVerify(t *testing.T) {
	secret := []byte(strings.Repeat("s", 32))
	now := time.Unix(1_800_000_000, 0)
	mk := func() *http.Request {
		r := httptest.NewRequest("GET", "http://gw.test/sandboxes/abc?x=1", nil)
		if err := gatewayauth.Sign(secret, r, "k123", now); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if id, err := gatewayauth.Verify(secret, mk(), now.Add(time.Minute)); err != nil || id != "k123" {
		t.Fatalf("Verify = %q, %v; want k123", id, err)
	}
	cases := map[string]func(h *http.Request) ([]byte, time.Time){
		"other key": func(h *http.Request) ([]byte, time.Time) {
			h.Header.Set(gatewayauth.HeaderKey, "admin")
			return secret, now
		},
		"other path":   func(h *http.Request) ([]byte, time.Time) { h.URL.Path = "/sandboxes/def"; return secret, now },
		"other query":  func(h *http.Request) ([]byte, time.Time) { h.URL.RawQuery = "x=2"; return secret, now },
		"other method": func(h *http.Request) ([]byte, time.Time) { h.Method = "DELETE"; return secret, now },
		"other host":   func(h *http.Request) ([]byte, time.Time) { h.Host = "evil.test"; return secret, now },
		"other time": func(h *http.Request) ([]byte, time.Time) {
			h.Header.Set(gatewayauth.HeaderTime, "1800000001")
			return secret, now
		},
		"other secret": func(h *http.Request) ([]byte, time.Time) { return []byte(strings.Repeat("t", 32)), now },
		"stale":        func(h *http.Request) ([]byte, time.Time) { return secret, now.Add(gatewayauth.Skew + time.Second) },
		"early":        func(h *http.Request) ([]byte, time.Time) { return secret, now.Add(-gatewayauth.Skew - time.Second) },
		"no mac":       func(h *http.Request) ([]byte, time.Time) { h.Header.Del(gatewayauth.HeaderMAC); return secret, now },
		"short secret": func(h *http.Request) ([]byte, time.Time) { return secret[:31], now },
	}
	for name, change := range cases {
		h := mk()
		s, at := change(h)
		if id, err := gatewayauth.Verify(s, h, at); !errors.Is(err, gatewayauth.ErrInvalid) {
			t.Errorf("%s: Verify = %q, %v; want ErrInvalid", name, id, err)
		}
	}
	r := mk()
	gatewayauth.Strip(r.Header)
	if gatewayauth.Present(r) {
		t.Error("Strip left a header")
	}
}
