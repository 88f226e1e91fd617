package api

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// Routing headers E2B's SDKs send on every sandbox request.
const (
	hdrSandboxID   = "E2b-Sandbox-Id"
	hdrSandboxPort = "E2b-Sandbox-Port"
)

var sandboxIDRe = regexp.MustCompile(`^[a-z0-9]+$`)

type target struct {
	id   string
	port int
}

// sandboxTarget decides whether r is sandbox traffic, exactly as E2B's edge
// does: with Host an IP, localhost or sandbox.<domain> and a routing header
// present, route by the headers; otherwise a Host of <port>-<id>.<domain>.
func (s *Server) sandboxTarget(r *http.Request) (target, bool, error) {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	domain := strings.ToLower(s.cfg.Domain)

	idH, portH := r.Header.Get(hdrSandboxID), r.Header.Get(hdrSandboxPort)
	generic := host == "localhost" || net.ParseIP(strings.Trim(host, "[]")) != nil || host == "sandbox."+domain
	if generic && (idH != "" || portH != "") {
		if idH == "" || portH == "" {
			return target{}, true, errors.New("missing header")
		}
		port, err := strconv.Atoi(portH)
		if err != nil || port <= 0 || port > 65535 {
			return target{}, true, errors.New("Invalid sandbox port")
		}
		if !sandboxIDRe.MatchString(idH) {
			return target{}, true, errors.New("Invalid sandbox ID")
		}
		return target{id: idH, port: port}, true, nil
	}
	if domain == "" || !strings.HasSuffix(host, "."+domain) {
		return target{}, false, nil
	}
	label := strings.TrimSuffix(host, "."+domain)
	if strings.Contains(label, ".") {
		return target{}, false, nil
	}
	portS, id, ok := strings.Cut(label, "-")
	if !ok {
		return target{}, false, nil
	}
	port, err := strconv.Atoi(portS)
	if err != nil || port <= 0 || port > 65535 {
		return target{}, true, errors.New("Invalid sandbox port")
	}
	if !sandboxIDRe.MatchString(id) {
		return target{}, true, errors.New("Invalid sandbox ID")
	}
	return target{id: id, port: port}, true, nil
}

type sandboxGone struct {
	SandboxID string `json:"sandboxId"`
	Message   string `json:"message"`
	Code      int    `json:"code"`
}

func writeBadGateway(w http.ResponseWriter, id, msg string) {
	writeJSON(w, http.StatusBadGateway, sandboxGone{SandboxID: id, Message: msg, Code: http.StatusBadGateway})
}

// proxy forwards r to a port of a sandbox over its agent channel. The agent
// itself enforces X-Access-Token on its API; other ports are the sandbox's
// own business. Unknown, killed or dead sandboxes answer 502 as E2B's do,
// and so do paused ones unless they were created with autoResume, which the
// request then resumes.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, t target) {
	sb, err := s.cfg.Manager.Lookup(tenant.Traffic, t.id)
	if err == nil {
		defer sb.BeginActivity()() // the idle clock of lifecycle autoStop
	}
	if err == nil && !trafficAllowed(w, r, sb, t.port) { // traffic.go
		return
	}
	if err == nil && sb.State() == sandbox.StatePaused {
		if !sb.Options.AutoResume {
			writeBadGateway(w, t.id, "The sandbox is paused (resume it with connect)")
			return
		}
		// autoResume: the first request resumes it, with the usual TTL.
		if _, _, err := s.cfg.Manager.Connect(r.Context(), tenant.Traffic, t.id, sandbox.DefaultTimeout, true); err != nil {
			s.log.Warn("auto-resume failed", "id", t.id, "err", err)
			writeBadGateway(w, t.id, "The sandbox is paused and could not be resumed: "+err.Error())
			return
		}
	}
	if err != nil || sb.State() != sandbox.StateRunning {
		writeBadGateway(w, t.id, "The sandbox was not found")
		return
	}
	conn, err := sb.Agent().Conn(r.Context()) // waits for an agent that is re-dialing
	if err != nil {
		writeBadGateway(w, t.id, "The sandbox's agent is not connected")
		return
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&url.URL{Scheme: "http", Host: "sandbox:" + strconv.Itoa(t.port)})
			pr.Out.Host = r.Host
			pr.SetXForwarded()
		},
		Transport:     conn.Transport(),
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			if conn.IsClosed() {
				writeBadGateway(w, t.id, "The sandbox was not found")
				return
			}
			writeBadGateway(w, t.id, fmt.Sprintf("port %d of sandbox %s is not reachable: nothing is listening on it inside the sandbox (%v)", t.port, t.id, err))
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
