// Package registrytest starts a real registry for tests
// (localregistry: Debian's docker-registry on loopback) and builds small
// images for them.
package registrytest

import (
	"context"
	"errors"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cella-sandbox/cella/internal/image/localregistry"
)

// Registry is a registry started for a test.
type Registry struct {
	*localregistry.Registry
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
	var c config
	for _, o := range opts {
		o(&c)
	}
	r, err := localregistry.Run(t.TempDir(), c.user, c.password)
	if errors.Is(err, localregistry.ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return &Registry{r}
}

// Push writes img to repoTag in r and returns its manifest digest.
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) v1.Hash {
	t.Helper()
	d, err := r.Registry.Push(context.Background(), repoTag, img)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
