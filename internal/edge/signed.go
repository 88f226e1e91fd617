package edge

import (
	"crypto/subtle"
	"net/http"
	"strconv"
	"strings"

	"github.com/cella-sandbox/cella/internal/agentapi"
)

// signedTarget routes a signed file URL (the SDKs' uploadUrl/downloadUrl)
// that names no sandbox: with E2B_SANDBOX_URL set the SDK builds it as
// <sandbox URL>/files?path=…&signature=…, without the E2b-Sandbox-* headers
// a plain HTTP client (a browser, curl) will not send. The signature is
// envd's sha256 over path, operation, user, the sandbox's envd access token
// and the expiry, so it names exactly one sandbox: the one whose token
// makes it. That sandbox is the target; anything else (no signature, no
// sandbox signs it) is not sandbox traffic, and the agent still checks the
// signature and its expiry itself.
//
// Only requests to a generic host (an IP, localhost, sandbox.<domain>) are
// looked at, as for the routing headers. The cost is one sha256 per
// sandbox with a token, for requests that carry a signature.
func (p *Proxy) signedTarget(r *http.Request) (Target, bool) {
	if r.URL.Path != agentapi.FilesPath || r.Header.Get(hdrSandboxID) != "" || r.Header.Get(hdrSandboxPort) != "" {
		return Target{}, false
	}
	var op string
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		op = "read"
	case http.MethodPost:
		op = "write"
	default:
		return Target{}, false
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	if !strings.HasPrefix(sig, "v1_") || !genericHost(r.Host, p.domain) {
		return Target{}, false
	}
	var exp int64
	if v := q.Get("signature_expiration"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return Target{}, false
		}
		exp = n
	}
	path, user := q.Get("path"), q.Get("username")
	id, ok := p.router.Signed(func(token string) bool {
		want := agentapi.Signature(path, op, user, token, exp)
		return subtle.ConstantTimeCompare([]byte(want), []byte(sig)) == 1
	})
	if !ok {
		return Target{}, false
	}
	return Target{ID: id, Port: agentapi.Port}, true
}
