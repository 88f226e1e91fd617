package conformance

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/image/registrytest"
	"github.com/cella-sandbox/cella/internal/template"
)

// testLocalhost: every sandbox resolves localhost (127.0.0.1 and ::1) and
// its hostname, as E2B's do, whether its template has an /etc/hosts or
// not: base (debootstrap's minbase writes none) and an image without one
// get cella's at start; an image with its own keeps it.
func testLocalhost(t *testing.T, env *daemontest.Env) {
	base, err := env.Daemon.Templates.Get("base")
	if err != nil {
		t.Fatal(err)
	}
	reg := registrytest.Start(t)
	cfg := v1.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}}
	reg.Push(t, "nohosts:1", registrytest.Image(t, cfg, registrytest.DirLayer(t, base.RootFS)))
	own := registrytest.Layer(t, registrytest.TarOf(t, registrytest.File{Name: "etc", Dir: true},
		registrytest.File{Name: "etc/hosts", Body: "127.0.0.1\tlocalhost\n10.1.2.3\timage-own\n", Mode: 0o644}), registrytest.Gzip)
	reg.Push(t, "ownhosts:1", registrytest.Image(t, cfg, registrytest.DirLayer(t, base.RootFS), own))
	pull := func(t *testing.T, ref string) string {
		t.Helper()
		name := "hosts-" + strings.ReplaceAll(strings.ReplaceAll(ref, ":", "-"), ".", "-")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, err := env.Daemon.Templates.Pull(ctx, name, reg.Ref(ref), template.PullOptions{}); err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		t.Cleanup(func() { _ = env.Daemon.Templates.Delete(name) })
		return name
	}
	// getent hosts asks for IPv6 first (::1), ahostsv4 for IPv4.
	const resolve = `getent hosts localhost; getent ahostsv4 localhost | head -1; getent hosts cella`
	for _, tc := range []struct{ name, template string }{
		{"Base", ""},
		{"ImageWithoutHosts", pull(t, "nohosts:1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := create(t, env, client.CreateRequest{TemplateID: tc.template})
			res := run(t, sb, resolve, client.ExecOptions{})
			lines := strings.Split(res.Stdout, "\n")
			if res.ExitCode != 0 || len(lines) < 3 || !strings.HasPrefix(lines[0], "::1 ") || !strings.HasPrefix(lines[1], "127.0.0.1 ") || !strings.HasSuffix(lines[2], " cella") {
				t.Fatalf("localhost and the hostname in a sandbox of %q: exit %d, stdout %q, stderr %q", tc.template, res.ExitCode, res.Stdout, res.Stderr)
			}
		})
	}
	t.Run("ImageWithOwnHosts", func(t *testing.T) {
		sb := create(t, env, client.CreateRequest{TemplateID: pull(t, "ownhosts:1")})
		if out := mustOK(t, sb, "cat /etc/hosts"); out != "127.0.0.1\tlocalhost\n10.1.2.3\timage-own\n" {
			t.Fatalf("the image's own /etc/hosts was not kept: %q", out)
		}
	})
}
