// Package gatewayauth is how a cluster's gateway tells a node who is
// asking: the gateway authenticates the client's API key itself and adds
// an assertion — the key's ID, the time, and an HMAC-SHA256 over them and
// the request's method, host and URI under the cluster's gateway secret (a
// Kubernetes Secret only gateways and nodes read). A node acts as that key
// only when the MAC verifies; a client cannot make one without the secret,
// and one seen on the wire is good for that one request line for Skew.
//
// It knows HTTP headers and nothing else: the secret's home is
// internal/cluster, the checks' use internal/api and internal/gateway.
package gatewayauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// The headers of an assertion.
const (
	HeaderKey  = "X-Cella-Gateway-Key"
	HeaderTime = "X-Cella-Gateway-Time"
	HeaderMAC  = "X-Cella-Gateway-Mac"
)

// Skew is how far an assertion's time may be from the node's clock.
const Skew = 2 * time.Minute

// MinSecretLen is the shortest secret Sign and Verify accept.
const MinSecretLen = 32

// Strip removes any assertion a request carries: a gateway strips what a
// client sent before it adds its own.
func Strip(h http.Header) {
	h.Del(HeaderKey)
	h.Del(HeaderTime)
	h.Del(HeaderMAC)
}

// Present reports whether r carries (part of) an assertion.
func Present(r *http.Request) bool {
	return r.Header.Get(HeaderKey) != "" || r.Header.Get(HeaderTime) != "" || r.Header.Get(HeaderMAC) != ""
}

// Sign asserts that the request r is made by API key keyID.
func Sign(secret []byte, r *http.Request, keyID string, now time.Time) error {
	if len(secret) < MinSecretLen {
		return fmt.Errorf("gateway secret: %d bytes, want at least %d", len(secret), MinSecretLen)
	}
	ts := strconv.FormatInt(now.Unix(), 10)
	r.Header.Set(HeaderKey, keyID)
	r.Header.Set(HeaderTime, ts)
	r.Header.Set(HeaderMAC, mac(secret, r, keyID, ts))
	return nil
}

// ErrInvalid is an assertion that does not verify.
var ErrInvalid = errors.New("invalid gateway assertion")

// Verify returns the key ID r's assertion names, or an error wrapping
// ErrInvalid (a wrong MAC, a time outside Skew, a missing part).
func Verify(secret []byte, r *http.Request, now time.Time) (string, error) {
	if len(secret) < MinSecretLen {
		return "", fmt.Errorf("%w: this node has no gateway secret", ErrInvalid)
	}
	keyID, ts, got := r.Header.Get(HeaderKey), r.Header.Get(HeaderTime), r.Header.Get(HeaderMAC)
	if keyID == "" || ts == "" || got == "" {
		return "", fmt.Errorf("%w: want all of %s, %s and %s", ErrInvalid, HeaderKey, HeaderTime, HeaderMAC)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: %s %q is not a Unix time", ErrInvalid, HeaderTime, ts)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > Skew || d < -Skew {
		return "", fmt.Errorf("%w: made %v from this node's clock (at most %v)", ErrInvalid, d.Round(time.Second), Skew)
	}
	if !hmac.Equal([]byte(got), []byte(mac(secret, r, keyID, ts))) {
		return "", fmt.Errorf("%w: the MAC does not verify", ErrInvalid)
	}
	return keyID, nil
}

// mac binds the key and time to the request line and host, so an
// assertion cannot be moved to another request.
func mac(secret []byte, r *http.Request, keyID, ts string) string {
	m := hmac.New(sha256.New, secret)
	for _, part := range []string{keyID, ts, r.Method, r.Host, r.URL.RequestURI()} {
		m.Write([]byte(part))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil))
}
