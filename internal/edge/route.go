package edge

import (
	"errors"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

// Routing headers E2B's SDKs send on every sandbox request.
const (
	hdrSandboxID   = "E2b-Sandbox-Id"
	hdrSandboxPort = "E2b-Sandbox-Port"
)

var sandboxIDRe = regexp.MustCompile(`^[a-z0-9]+$`)

// Target is where a request goes: a port of a sandbox.
type Target struct {
	ID   string
	Port int
}

// target decides whether r is sandbox traffic, exactly as E2B's edge does:
// with Host an IP, localhost or sandbox.<domain> and a routing header
// present, route by the headers; otherwise a Host of <port>-<id>.<domain>.
// ok is false for a request that is not sandbox traffic; err is set for one
// that is, but names no valid target (a 400).
func target(r *http.Request, domain string) (t Target, ok bool, err error) {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	domain = strings.ToLower(domain)

	idH, portH := r.Header.Get(hdrSandboxID), r.Header.Get(hdrSandboxPort)
	if genericHost(host, domain) && (idH != "" || portH != "") {
		if idH == "" || portH == "" {
			return Target{}, true, errors.New("missing header")
		}
		port, err := strconv.Atoi(portH)
		if err != nil || port <= 0 || port > 65535 {
			return Target{}, true, errors.New("Invalid sandbox port")
		}
		if !sandboxIDRe.MatchString(idH) {
			return Target{}, true, errors.New("Invalid sandbox ID")
		}
		return Target{ID: idH, Port: port}, true, nil
	}
	if domain == "" || !strings.HasSuffix(host, "."+domain) {
		return Target{}, false, nil
	}
	label := strings.TrimSuffix(host, "."+domain)
	if strings.Contains(label, ".") {
		return Target{}, false, nil
	}
	portS, id, ok := strings.Cut(label, "-")
	if !ok {
		return Target{}, false, nil
	}
	port, err := strconv.Atoi(portS)
	if err != nil || port <= 0 || port > 65535 {
		return Target{}, true, errors.New("Invalid sandbox port")
	}
	if !sandboxIDRe.MatchString(id) {
		return Target{}, true, errors.New("Invalid sandbox ID")
	}
	return Target{ID: id, Port: port}, true, nil
}

// TargetOf is target for a front that routes sandbox traffic elsewhere (a
// gateway forwarding to the sandbox's node): the same decision, so both
// hops agree on what is sandbox traffic.
func TargetOf(r *http.Request, domain string) (t Target, ok bool, err error) {
	return target(r, domain)
}

// genericHost is a Host that names no sandbox: an IP, localhost or
// sandbox.<domain> (E2B's shared sandbox host), where the routing headers
// (or a signed URL's signature) say which sandbox is meant.
func genericHost(host, domain string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	return host == "localhost" || net.ParseIP(strings.Trim(host, "[]")) != nil || host == "sandbox."+strings.ToLower(domain)
}
