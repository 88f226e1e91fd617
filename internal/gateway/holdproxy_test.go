package gateway_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// holdingProxy is a real HTTP hop in front of a node — the node advertises
// it (--advertise-url), so gateways reach the node through it, as through
// a load balancer — that holds the first request hold matches until the
// test releases it, so a test can order what happens around that request
// without a sleep. A held request whose sender gave up in the meantime is
// still sent on once released, as bytes already on the wire would be, and
// its answer dropped.
type holdingProxy struct {
	URL string
	// arrived is closed when the held request has reached the proxy.
	arrived chan struct{}
	// senderGone says the held request's sender (a gateway) gave it up
	// before the release.
	senderGone atomic.Bool

	hold     func(*http.Request) bool
	release  chan struct{}
	once     sync.Once // the first request hold matches is held
	released sync.Once
	target   atomic.Pointer[httputil.ReverseProxy]
}

func newHoldingProxy(t *testing.T, hold func(*http.Request) bool) *holdingProxy {
	t.Helper()
	p := &holdingProxy{arrived: make(chan struct{}), release: make(chan struct{}), hold: hold}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	t.Cleanup(p.Release) // a test that failed before the release frees the handler
	p.URL = srv.URL
	return p
}

// to points the proxy at the node's own URL (known once it runs).
func (p *holdingProxy) to(t *testing.T, node string) {
	t.Helper()
	u, err := url.Parse(node)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	p.target.Store(rp)
}

// Release lets the held request (and every later one) through.
func (p *holdingProxy) Release() {
	p.released.Do(func() { close(p.release) })
}

func (p *holdingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	held := false
	if p.hold(r) {
		p.once.Do(func() { held = true })
	}
	if held {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		close(p.arrived)
		select {
		case <-p.release:
		case <-r.Context().Done():
			p.senderGone.Store(true)
			<-p.release
		}
		r = r.WithContext(context.WithoutCancel(r.Context()))
		// Without a context to end it, ReverseProxy would end the request
		// when the sender's connection closes (http.CloseNotifier).
		w = uncloseable{w}
	}
	rp := p.target.Load()
	if rp == nil {
		http.Error(w, "the node behind this proxy is not up yet", http.StatusServiceUnavailable)
		return
	}
	rp.ServeHTTP(w, r)
}

// uncloseable hides the http.CloseNotifier of the ResponseWriter it wraps.
type uncloseable struct{ http.ResponseWriter }

func (u uncloseable) Unwrap() http.ResponseWriter { return u.ResponseWriter }
