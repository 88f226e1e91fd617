package edge

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/upgrade"
)

// sandboxError is E2B's answer for a sandbox the edge cannot reach.
type sandboxError struct {
	SandboxID string `json:"sandboxId"`
	Message   string `json:"message"`
	Code      int    `json:"code"`
}

// errorBody is E2B's (and envd's) error shape: code equals the HTTP status.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// BadGateway answers 502 for sandbox id in E2B's shape: the sandbox (or
// what was asked of it) is not reachable.
func BadGateway(w http.ResponseWriter, id, msg string) {
	writeJSON(w, http.StatusBadGateway, sandboxError{SandboxID: id, Message: msg, Code: http.StatusBadGateway})
}

// serve forwards r to a port of a sandbox over its link. The agent itself
// enforces the access token on its API too; other ports are the sandbox's
// own business once the traffic token (if any) passed. Unknown, killed or
// dead sandboxes answer 502 as E2B's do, and so do paused ones unless they
// were created with autoResume, which the request then resumes (Route).
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, t Target) {
	start := time.Now()
	var end func()
	sb, err := p.router.Route(r.Context(), t.ID, func(sb Sandbox) error {
		end = sb.BeginActivity() // the idle clock of lifecycle autoStop
		return admit(r, sb, t.Port)
	})
	if end != nil {
		defer end()
	}
	var refused *refusal
	var paused *PausedError
	switch {
	case errors.As(err, &refused):
		writeJSON(w, refused.status, refused.body)
		return
	case errors.As(err, &paused):
		BadGateway(w, t.ID, paused.Error())
		return
	case err != nil:
		BadGateway(w, t.ID, "The sandbox was not found")
		return
	}
	link, err := sb.Link(r.Context())
	if err != nil {
		BadGateway(w, t.ID, "The sandbox's agent is not connected")
		return
	}
	timing := p.timeExecStart(r, t, sb, start) // execstart.go
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&url.URL{Scheme: "http", Host: agentapi.LinkHost + ":" + strconv.Itoa(t.Port)})
			pr.Out.Host = r.Host
			pr.SetXForwarded() // X-Forwarded-Host: the Host the client used
			if t.Port != agentapi.Port {
				if mask := sb.RequestHost(t.Port); mask != "" {
					// network.maskRequestHost, for servers that check
					// the Host they are addressed by (E2B's proxy).
					pr.Out.Host = mask
				}
			}
		},
		Transport:     link,
		FlushInterval: -1,
		ModifyResponse: func(res *http.Response) error {
			if err := upgrade.Check(res); err != nil {
				return err
			}
			if timing != nil {
				return timing(res)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			if link.Closed() {
				BadGateway(w, t.ID, "The sandbox was not found")
				return
			}
			var switched *upgrade.UnaskedError
			if errors.As(err, &switched) {
				BadGateway(w, t.ID, fmt.Sprintf("port %d of sandbox %s answered: %v", t.Port, t.ID, err))
				return
			}
			BadGateway(w, t.ID, fmt.Sprintf("port %d of sandbox %s is not reachable: nothing is listening on it inside the sandbox (%v)", t.Port, t.ID, err))
		},
	}
	// Full duplex: by default net/http discards and closes the rest of the
	// request body as soon as the response header is written, and when the
	// sandbox answers before the transport has seen the body's EOF the
	// transport's next read hits "invalid Read on closed Body" and it tears
	// the connection down mid-response (a code-interpreter cell's NDJSON
	// answer then ended after its first line). The transport must own the
	// body until it is done with it.
	_ = http.NewResponseController(w).EnableFullDuplex()
	rp.ServeHTTP(w, r)
}
