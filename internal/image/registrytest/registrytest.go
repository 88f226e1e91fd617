// Package registrytest starts a real registry for tests: Debian's
// docker-registry (the CNCF distribution registry) on a free loopback
// port, with its storage in a temp dir, optionally behind htpasswd auth.
package registrytest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// Binary is the registry Debian's docker-registry package installs.
const Binary = "docker-registry"

// Registry is a running registry.
type Registry struct {
	// Addr is host:port, the registry part of image references.
	Addr     string
	User     string
	Password string // empty: no auth
	Dir      string
}

// Option changes how the registry is started.
type Option func(*config)

type config struct{ user, password string }

// WithAuth puts the registry behind htpasswd auth for user:password.
func WithAuth(user, password string) Option {
	return func(c *config) { c.user, c.password = user, password }
}

// Start starts a registry for the test and stops it (and removes its
// storage) when the test ends. It skips the test when docker-registry is
// not installed (make deps installs it).
func Start(t testing.TB, opts ...Option) *Registry {
	t.Helper()
	bin, err := exec.LookPath(Binary)
	if err != nil {
		t.Skipf("%s not installed (apt-get install docker-registry; make deps does)", Binary)
	}
	var c config
	for _, o := range opts {
		o(&c)
	}
	dir := t.TempDir()
	r := &Registry{User: c.user, Password: c.password, Dir: dir}
	auth := ""
	if c.user != "" {
		hash, err := bcrypt.GenerateFromPassword([]byte(c.password), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		pw := filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(pw, []byte(c.user+":"+string(hash)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: cella-test\n    path: %s\n", pw)
	}
	// A port picked by the kernel, then handed to the registry: another
	// process could take it in between, so a failed start is retried.
	for attempt := 0; ; attempt++ {
		addr := freePort(t)
		cfg := filepath.Join(dir, "config.yml")
		yml := fmt.Sprintf("version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n%s",
			filepath.Join(dir, "data"), addr, auth)
		if err := os.WriteFile(cfg, []byte(yml), 0o600); err != nil {
			t.Fatal(err)
		}
		logf, err := os.Create(filepath.Join(dir, "registry.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "serve", cfg)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); logf.Close(); close(done) }()
		stop := func() {
			cmd.Process.Kill()
			<-done
		}
		if waitReady(addr, done) {
			r.Addr = addr
			t.Cleanup(stop)
			return r
		}
		stop()
		if attempt == 2 {
			b, _ := os.ReadFile(filepath.Join(dir, "registry.log"))
			t.Fatalf("%s did not start: %s", Binary, b)
		}
	}
}

func freePort(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitReady polls /v2/ until the registry answers (200, or 401 behind
// auth), it exits, or a generous deadline passes.
func waitReady(addr string, exited <-chan struct{}) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v2/", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return true
			}
		}
		select {
		case <-exited:
			return false
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Ref is the reference of repo:tag in this registry.
func (r *Registry) Ref(repoTag string) string {
	return r.Addr + "/" + strings.TrimPrefix(repoTag, "/")
}
