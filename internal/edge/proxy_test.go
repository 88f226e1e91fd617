package edge

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/envd/process/processconnect"
)

// The edge's own decisions, against a router of test sandboxes whose link
// reaches a real HTTP server standing for the inside of the sandbox. The
// router keeps Router's contract as internal/sandbox does (admit first,
// then the paused decision); the daemon's own Route is tested end to end
// by internal/api (TestAPI, TestTenancy, TestInteract).

type testSandbox struct {
	id, envd, traffic string
	paused, resumable bool
	insecure          bool
	mask              string
	linkErr           error
	backend           *httptest.Server
	closed            atomic.Bool

	mu       sync.Mutex
	begun    int
	ended    int
	resumed  int
	admitted int
}

func (s *testSandbox) ID() string                 { return s.id }
func (s *testSandbox) EnvdAccessToken() string    { return s.envd }
func (s *testSandbox) TrafficAccessToken() string { return s.traffic }
func (s *testSandbox) EnvdTokenOptional() bool    { return s.insecure }
func (s *testSandbox) RequestHost(port int) string {
	return strings.ReplaceAll(s.mask, "${PORT}", fmt.Sprint(port))
}
func (s *testSandbox) BeginActivity() func() {
	s.mu.Lock()
	s.begun++
	s.mu.Unlock()
	return func() { s.mu.Lock(); s.ended++; s.mu.Unlock() }
}
func (s *testSandbox) Process(string) processconnect.ProcessClient { return nil }
func (s *testSandbox) Ended() (string, bool)                       { return "", false }
func (s *testSandbox) Link(context.Context) (Link, error) {
	if s.linkErr != nil {
		return nil, s.linkErr
	}
	addr := s.backend.Listener.Addr().String()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}}
	return testLink{tr, s}, nil
}

type testLink struct {
	*http.Transport
	s *testSandbox
}

func (l testLink) Closed() bool { return l.s.closed.Load() }

type testRouter map[string]*testSandbox

func (rt testRouter) Route(ctx context.Context, id string, admit func(Sandbox) error) (Sandbox, error) {
	sb, ok := rt[id]
	if !ok {
		return nil, errors.New("not found")
	}
	if err := admit(sb); err != nil {
		return nil, err
	}
	sb.mu.Lock()
	sb.admitted++
	sb.mu.Unlock()
	if sb.paused {
		if !sb.resumable {
			return nil, &PausedError{}
		}
		sb.mu.Lock()
		sb.resumed++
		sb.mu.Unlock()
	}
	return sb, nil
}

func (rt testRouter) Signed(signs func(string) bool) (string, bool) {
	for id, sb := range rt {
		if sb.envd != "" && signs(sb.envd) {
			return id, true
		}
	}
	return "", false
}

type answer struct {
	status int
	ctype  string
	body   map[string]any
	raw    string
}

func call(t *testing.T, h http.Handler, method, target string, hdr map[string]string) answer {
	t.Helper()
	r := httptest.NewRequest(method, target, nil)
	r.Host = "127.0.0.1:3000"
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	a := answer{status: w.Code, ctype: w.Header().Get("Content-Type"), raw: w.Body.String()}
	_ = json.Unmarshal(w.Body.Bytes(), &a.body)
	return a
}

func TestProxy(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "inside %s %s host=%s xff=%v token=%q", r.Method, r.URL.RequestURI(), r.Host, r.Header.Get("X-Forwarded-For") != "", r.Header.Get(agentapi.AccessTokenHeader))
	}))
	defer backend.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close() // a port nothing listens on
	sbs := testRouter{
		"open":     {id: "open", envd: "envd-1", backend: backend},
		"insecure": {id: "insecure", envd: "envd-5", insecure: true, backend: backend},
		"masked":   {id: "masked", envd: "envd-6", mask: "${PORT}-app.internal:${PORT}", backend: backend},
		"private":  {id: "private", envd: "envd-2", traffic: "traffic-2", backend: backend},
		"paused":   {id: "paused", envd: "envd-3", paused: true, backend: backend},
		"autores":  {id: "autores", envd: "envd-4", traffic: "traffic-4", paused: true, resumable: true, backend: backend},
		"nolink":   {id: "nolink", linkErr: errors.New("not connected"), backend: backend},
		"noport":   {id: "noport", backend: dead},
		"goneport": {id: "goneport", backend: dead},
	}
	sbs["goneport"].closed.Store(true)
	p := New(Config{Router: sbs, Domain: "cella.test"})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !p.Handle(w, r) {
			w.WriteHeader(http.StatusTeapot) // the API's
		}
	})
	to := func(id string, port int, more ...string) map[string]string {
		m := map[string]string{hdrSandboxID: id, hdrSandboxPort: fmt.Sprint(port)}
		for i := 0; i+1 < len(more); i += 2 {
			m[more[i]] = more[i+1]
		}
		return m
	}
	envd := agentapi.Port
	unauthorized := map[string]any{"code": 401.0, "message": agentapi.UnauthorizedMessage}
	for _, c := range []struct {
		name, method, path string
		hdr                map[string]string
		status             int
		body               map[string]any
		inside             string
	}{
		{"not sandbox traffic", "GET", "/sandboxes", nil, http.StatusTeapot, nil, ""},
		{"bad routing", "GET", "/", map[string]string{hdrSandboxID: "open"}, 400, nil, ""},
		{"envd without token", "GET", "/envs", to("open", envd), 401, unauthorized, ""},
		{"envd wrong token", "GET", "/envs", to("open", envd, agentapi.AccessTokenHeader, "envd-2"), 401, unauthorized, ""},
		{"envd token", "GET", "/envs", to("open", envd, agentapi.AccessTokenHeader, "envd-1"), 200, nil, `inside GET /envs host=127.0.0.1:3000 xff=true token="envd-1"`},
		{"health needs no token", "GET", "/health", to("open", envd), 200, nil, "inside GET /health"},
		{"health POST does", "POST", "/health", to("open", envd), 401, unauthorized, ""},
		{"signed download", "GET", "/files?path=/a&signature=v1_x", to("open", envd), 200, nil, "inside GET /files?path=/a&signature=v1_x"},
		{"unsigned download", "GET", "/files?path=/a", to("open", envd), 401, unauthorized, ""},
		{"init needs the token", "POST", "/init", to("open", envd), 401, unauthorized, ""},
		{"the channel's credential is refused without the token as well", "POST", agentapi.ChannelTokenPath, to("open", envd), 404, nil, ""},
		{"the spawn timing is the daemon's own, token or not", "POST", agentapi.SpawnPath, to("open", envd, agentapi.AccessTokenHeader, "envd-1"), 404,
			map[string]any{"code": 404.0, "message": "not found: " + agentapi.SpawnPath + " is the daemon's own"}, ""},
		{"so for secure: false too", "POST", agentapi.SpawnPath, to("insecure", envd), 404, nil, ""},
		{"the channel's next credential is the daemon's own, token or not", "POST", agentapi.ChannelTokenPath, to("open", envd, agentapi.AccessTokenHeader, "envd-1"), 404,
			map[string]any{"code": 404.0, "message": "not found: " + agentapi.ChannelTokenPath + " is the daemon's own"}, ""},
		{"so is the audit feed", "GET", agentapi.EventsPath, to("open", envd, agentapi.AccessTokenHeader, "envd-1"), 404,
			map[string]any{"code": 404.0, "message": "not found: " + agentapi.EventsPath + " is the daemon's own"}, ""},
		{"the channel's credential for secure: false too", "POST", agentapi.ChannelTokenPath, to("insecure", envd), 404, nil, ""},
		{"secure: false lets envd requests in without the token, which the edge adds", "POST", "/process.Process/List", to("insecure", envd), 200, nil, `inside POST /process.Process/List host=127.0.0.1:3000 xff=true token="envd-5"`},
		{"secure: false still refuses a wrong token", "GET", "/envs", to("insecure", envd, agentapi.AccessTokenHeader, "envd-1"), 401, unauthorized, ""},
		{"public port", "GET", "/x", to("open", 8080), 200, nil, "inside GET /x"},
		{"maskRequestHost rewrites the Host, ${PORT} filled in", "GET", "/m", to("masked", 8080), 200, nil, "inside GET /m host=8080-app.internal:8080 xff=true"},
		{"maskRequestHost leaves the agent's port alone", "GET", "/envs", to("masked", envd, agentapi.AccessTokenHeader, "envd-6"), 200, nil, "inside GET /envs host=127.0.0.1:3000"},
		{"private port without token", "GET", "/x", to("private", 8080), 403, map[string]any{"sandboxId": "private", "code": 403.0,
			"message": "this sandbox does not allow public traffic: send the sandbox's trafficAccessToken in the e2b-traffic-access-token header"}, ""},
		{"private port wrong token", "GET", "/x", to("private", 8080, hdrTrafficToken, "traffic-4"), 403, map[string]any{"sandboxId": "private", "code": 403.0,
			"message": "invalid e2b-traffic-access-token for this sandbox"}, ""},
		{"private port token", "GET", "/x", to("private", 8080, hdrTrafficToken, "traffic-2"), 200, nil, "inside GET /x"},
		{"private sandbox's envd port takes no traffic token", "GET", "/envs", to("private", envd, hdrTrafficToken, "traffic-2"), 401, unauthorized, ""},
		{"by host", "GET", "/y", map[string]string{"Host": "8080-open.cella.test"}, 200, nil, "inside GET /y host=8080-open.cella.test"},
		{"unknown", "GET", "/", to("nosuch", 8080), 502, map[string]any{"sandboxId": "nosuch", "code": 502.0, "message": "The sandbox was not found"}, ""},
		{"paused", "GET", "/", to("paused", 8080), 502, map[string]any{"sandboxId": "paused", "code": 502.0, "message": "The sandbox is paused (resume it with connect)"}, ""},
		{"autoResume refused before resume", "GET", "/", to("autores", 8080), 403, nil, ""},
		{"autoResume", "GET", "/z", to("autores", 8080, hdrTrafficToken, "traffic-4"), 200, nil, "inside GET /z"},
		{"agent not connected", "GET", "/", to("nolink", 8080), 502, map[string]any{"sandboxId": "nolink", "code": 502.0, "message": "The sandbox's agent is not connected"}, ""},
		{"gone mid-request", "GET", "/", to("goneport", 8080), 502, map[string]any{"sandboxId": "goneport", "code": 502.0, "message": "The sandbox was not found"}, ""},
	} {
		hdr := map[string]string{}
		host := ""
		for k, v := range c.hdr {
			if k == "Host" {
				host = v
				continue
			}
			hdr[k] = v
		}
		r := httptest.NewRequest(c.method, c.path, nil)
		r.Host = "127.0.0.1:3000"
		if host != "" {
			r.Host = host
		}
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var body map[string]any
		_ = json.Unmarshal(w.Body.Bytes(), &body)
		if w.Code != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, w.Code, w.Body, c.status)
			continue
		}
		if c.body != nil {
			if ct := w.Header().Get("Content-Type"); ct != "application/json; charset=utf-8" {
				t.Errorf("%s: content type %q", c.name, ct)
			}
			if fmt.Sprint(body) != fmt.Sprint(c.body) {
				t.Errorf("%s: body %s, want %v", c.name, w.Body, c.body)
			}
		}
		if c.inside != "" && !strings.HasPrefix(w.Body.String(), c.inside) {
			t.Errorf("%s: body %q, want it to start with %q", c.name, w.Body, c.inside)
		}
	}
	// A port nothing listens on: the answer names it.
	if a := call(t, h, "GET", "/", to("noport", 8080)); a.status != 502 || !strings.Contains(a.raw, "port 8080 of sandbox noport is not reachable: nothing is listening on it inside the sandbox") {
		t.Errorf("closed port: %d %s", a.status, a.raw)
	}
	// Every request to a found sandbox counts as activity, refused or
	// not, and ends; nothing is resumed or passed on before admit passed.
	for id, sb := range sbs {
		if sb.begun != sb.ended {
			t.Errorf("%s: %d activities begun, %d ended", id, sb.begun, sb.ended)
		}
	}
	if ar := sbs["autores"]; ar.begun != 2 || ar.resumed != 1 || ar.admitted != 1 {
		t.Errorf("autoResume sandbox: %d requests, %d admitted, %d resumes; want 2, 1, 1", ar.begun, ar.admitted, ar.resumed)
	}
}

// TestProxyStreams: an answer streams as the sandbox writes it (each line
// reaches the client before the next is written), while the request body
// is still open: full duplex, as a code-interpreter cell's NDJSON answer
// needs.
func TestProxyStreams(t *testing.T) {
	next := make(chan struct{})
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex() // as the edge's own side must be
		for i := range 3 {
			fmt.Fprintf(w, "line %d\n", i)
			_ = rc.Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "body %s\n", b)
	}))
	defer backend.Close()
	p := New(Config{Router: testRouter{"s": {id: "s", backend: backend}}})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.Handle(w, r) }))
	defer front.Close()
	// A failure leaves handlers blocked on bodies: cut them loose first.
	defer front.CloseClientConnections()
	defer backend.CloseClientConnections()
	defer close(next)
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", front.URL+"/run", pr)
	req.Header.Set(hdrSandboxID, "s")
	req.Header.Set(hdrSandboxPort, "49999")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req = req.WithContext(ctx)
	context.AfterFunc(ctx, func() { pw.CloseWithError(ctx.Err()) }) // or the client waits on the body
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		line, err := br.ReadString('\n')
		if err != nil || line != fmt.Sprintf("line %d\n", i) {
			t.Fatalf("line %d: %q %v", i, line, err)
		}
		next <- struct{}{}
	}
	_, _ = pw.Write([]byte("sent late"))
	pw.Close()
	if line, err := br.ReadString('\n'); err != nil || line != "body sent late\n" {
		t.Fatalf("after the body: %q %v", line, err)
	}
}

// TestUnaskedUpgradeClosesItsStream: a sandbox port that answers a plain
// request with 101 Switching Protocols gets the client a 502 that says so,
// and the stream into the sandbox is closed at once (httputil would leave
// it to a finalizer), also when the protocol is the one asked for only
// under a Unicode case fold, which httputil's ASCII fold refuses; an
// upgrade the request asked for still passes.
func TestUnaskedUpgradeClosesItsStream(t *testing.T) {
	closed := make(chan struct{}, 2)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		to := "other"
		if r.URL.Path == "/kelvin" {
			to = "websoc\u212aet" // Kelvin's K
		}
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + to + "\r\n\r\n")
		brw.Flush()
		io.Copy(io.Discard, brw) // until the edge closes the stream
		closed <- struct{}{}
	}))
	defer backend.Close()
	p := New(Config{Router: testRouter{"open": {id: "open", envd: "envd-1", backend: backend}}, Domain: "cella.test"})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.Handle(w, r) }))
	defer front.Close()
	send := func(path, upgrade string) (int, string) {
		t.Helper()
		c, err := net.Dial("tcp", front.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		req := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s: open\r\n%s: 8080\r\n", path, hdrSandboxID, hdrSandboxPort)
		if upgrade != "" {
			req += "Connection: Upgrade\r\nUpgrade: " + upgrade + "\r\n"
		}
		io.WriteString(c, req+"\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct{ path, asked string }{{"/x", ""}, {"/x", "websocket"}, {"/kelvin", "websocket"}} {
		if code, body := send(c.path, c.asked); code != http.StatusBadGateway || !strings.Contains(body, "did not ask for") {
			t.Errorf("GET %s, a 101 the request asking for %q did not ask for: %d %s", c.path, c.asked, code, body)
		}
		select {
		case <-closed:
		case <-time.After(time.Minute):
			t.Fatalf("GET %s: the stream of a 101 the request (upgrade %q) did not ask for is still open", c.path, c.asked)
		}
	}
	if code, _ := send("/x", "other"); code != http.StatusSwitchingProtocols {
		t.Errorf("the upgrade the request asked for: %d", code)
	}
}
