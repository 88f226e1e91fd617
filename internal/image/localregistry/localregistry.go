// Package localregistry runs Debian's docker-registry (the CNCF
// distribution registry) on a free loopback port with its storage in a
// directory of the caller's, optionally behind htpasswd auth: the real
// registry tests and benchmarks pull from and push to.
package localregistry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/crypto/bcrypt"
)

// Binary is the registry Debian's docker-registry package installs.
const Binary = "docker-registry"

// ErrNotInstalled is returned by Run when docker-registry is missing.
var ErrNotInstalled = errors.New(Binary + " is not installed (apt-get install docker-registry; make deps does)")

// Registry is a running registry.
type Registry struct {
	// Addr is host:port, the registry part of image references.
	Addr     string
	User     string
	Password string // empty: no auth
	Dir      string // config, storage (Dir/data) and log

	stop func()
}

// Run starts a registry storing in dir (which must exist), behind
// htpasswd auth for user:password unless user is empty. Stop it with Stop.
func Run(dir, user, password string) (*Registry, error) {
	bin, err := exec.LookPath(Binary)
	if err != nil {
		return nil, ErrNotInstalled
	}
	r := &Registry{User: user, Password: password, Dir: dir}
	auth := ""
	if user != "" {
		hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
		if err != nil {
			return nil, err
		}
		pw := filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(pw, []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
			return nil, err
		}
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: cella-test\n    path: %s\n", pw)
	}
	// A port picked by the kernel, then handed to the registry: another
	// process could take it in between, so a failed start is retried.
	for attempt := 0; ; attempt++ {
		addr, err := freePort()
		if err != nil {
			return nil, err
		}
		cfg := filepath.Join(dir, "config.yml")
		yml := fmt.Sprintf("version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n%s",
			filepath.Join(dir, "data"), addr, auth)
		if err := os.WriteFile(cfg, []byte(yml), 0o600); err != nil {
			return nil, err
		}
		logf, err := os.Create(filepath.Join(dir, "registry.log"))
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(bin, "serve", cfg)
		cmd.Stdout, cmd.Stderr = logf, logf
		// It dies with whoever started it, even one killed before Stop.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		done := make(chan struct{})
		started := make(chan error, 1)
		go func() {
			// The parent death signal follows the thread that forked, not
			// the process: a thread that ends (the Go runtime ends those a
			// goroutine left locked, as rootfs's throwaway threads are)
			// would kill the registry mid-test. This thread lives until it
			// exits.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if err := cmd.Start(); err != nil {
				logf.Close()
				started <- err
				return
			}
			started <- nil
			_ = cmd.Wait()
			logf.Close()
			close(done)
		}()
		if err := <-started; err != nil {
			return nil, err
		}
		stop := func() {
			cmd.Process.Kill()
			<-done
		}
		if waitReady(addr, done) {
			r.Addr, r.stop = addr, stop
			return r, nil
		}
		stop()
		if attempt == 2 {
			b, _ := os.ReadFile(filepath.Join(dir, "registry.log"))
			return nil, fmt.Errorf("%s did not start: %s", Binary, b)
		}
	}
}

// Stop stops the registry (its storage stays in Dir).
func (r *Registry) Stop() {
	if r.stop != nil {
		r.stop()
		r.stop = nil
	}
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
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

// Auth is the registry's credentials (anonymous without auth).
func (r *Registry) Auth() authn.Authenticator {
	if r.User == "" {
		return authn.Anonymous
	}
	return authn.FromConfig(authn.AuthConfig{Username: r.User, Password: r.Password})
}

// Push writes img to repoTag in r (with r's credentials) and returns its
// manifest digest.
func (r *Registry) Push(ctx context.Context, repoTag string, img v1.Image) (v1.Hash, error) {
	ref, err := name.ParseReference(r.Ref(repoTag))
	if err != nil {
		return v1.Hash{}, err
	}
	if err := remote.Write(ref, img, remote.WithAuth(r.Auth()), remote.WithContext(ctx)); err != nil {
		return v1.Hash{}, err
	}
	return img.Digest()
}
