package build_test

import (
	"context"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/template"
)

// TestBuiltOnDocker: a template built on the docker template runs its
// engine, in the build's steps and in its own sandboxes (a build names its
// result with its base's services); one built on base runs none.
func TestBuiltOnDocker(t *testing.T) {
	store, err := template.NewStore(daemontest.CacheDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.EnsureNamed(context.Background(), template.DockerName, io.Discard); err != nil {
		t.Fatalf("docker template: %v", err)
	}
	e := start(t, daemontest.Options{})
	name := e.name()
	spec := build.Spec{Name: name, Base: build.Base{Template: template.DockerName}, Steps: []build.Step{
		{Type: "RUN", Args: []string{"docker info --format '{{.KernelVersion}}' > /home/user/engine-in-step && " +
			"d=$(mktemp -d) && mkdir $d/bin && cp /bin/busybox $d/bin/ && ln -s busybox $d/bin/echo && tar -C $d -c . | docker import - step-image"}},
	}}
	if _, _, err := e.build(spec, nil); err != nil {
		t.Fatalf("build on docker: %v", err)
	}
	got, err := e.Daemon.Templates.Get(name)
	if err != nil || !slices.Equal(got.Services, []string{template.ServiceDocker}) {
		t.Fatalf("services of a template built on docker: %v (%v)", got, err)
	}
	// The step's engine state is in the template's layers now: its
	// sandboxes' engine starts on it (dockerd renames directories there,
	// which a lower layer refuses) and runs the image the step imported.
	// Its default limits are the daemon's (they follow the builtin's name):
	// Docker wants more than 512 MiB.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := e.Client.Create(ctx, client.CreateRequest{TemplateID: name, MemoryMB: template.DockerMemoryMB})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Client.Kill(context.Background(), sb.SandboxID)
	conn, err := e.Client.Sandbox(ctx, sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	out, err := conn.Exec(ctx, "cat ~/engine-in-step; docker info --format '{{.KernelVersion}}' && docker run --rm step-image echo ran || sudo tail -20 /var/log/dockerd.log", client.ExecOptions{Timeout: 3 * time.Minute})
	if err != nil || out.ExitCode != 0 || out.Stdout != "4.19.0-gvisor\n4.19.0-gvisor\nran\n" {
		t.Fatalf("in a sandbox of the template built on docker: %v exit %d %q %s", err, out.ExitCode, out.Stdout, out.Stderr)
	}

	plain := e.name()
	if _, _, err := e.build(build.Spec{Name: plain, Base: build.Base{Template: template.BaseName}, Steps: []build.Step{
		{Type: "RUN", Args: []string{"true"}},
	}}, nil); err != nil {
		t.Fatalf("build on base: %v", err)
	}
	if got, err := e.Daemon.Templates.Get(plain); err != nil || len(got.Services) != 0 {
		t.Fatalf("services of a template built on base: %v (%v)", got, err)
	}
}
