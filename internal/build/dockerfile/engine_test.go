package dockerfile_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/build/dockerfile"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/tenant"
)

func TestMultiStageDockerfile(t *testing.T) {
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{})
	ctxDir := t.TempDir()
	os.MkdirAll(filepath.Join(ctxDir, "files"), 0o755)
	os.WriteFile(filepath.Join(ctxDir, "files", "data.txt"), []byte("from the context\n"), 0o644)
	df := `FROM template:base AS builder
RUN mkdir -p /out && echo compiled > /out/app.txt
FROM template:base
ARG GREETING=hello
COPY files/ /srv/files/
COPY --from=builder /out/app.txt /opt/app.txt
ENV G="$GREETING world"
WORKDIR /srv
EXPOSE 8000
`
	b := make([]byte, 4)
	rand.Read(b)
	name := "df-" + hex.EncodeToString(b)
	t.Cleanup(func() { env.Daemon.Templates.Delete(name) })
	plan, err := dockerfile.Parse(strings.NewReader(df), dockerfile.Options{Name: name, Log: func(s string) { t.Log(s) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := dockerfile.EngineRunner{Engine: env.Daemon.BuildEngine, Templates: env.Daemon.Templates,
		P: tenant.Principal{Key: "k", Team: "df-" + hex.EncodeToString(b)}, Log: func(e build.LogEntry) { t.Log(e.Step, e.Message) }}
	if err := plan.Run(ctx, r, ctxDir); err != nil {
		t.Fatalf("build: %v", err)
	}
	if _, err := env.Daemon.Templates.Get(name + "-stage-0"); err == nil {
		t.Errorf("the builder stage's template was left behind")
	}
	sb, err := env.Client.Create(ctx, client.CreateRequest{TemplateID: name})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Client.Kill(context.Background(), sb.SandboxID)
	conn, err := env.Client.Sandbox(ctx, sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	out, err := conn.Exec(ctx, "cat /srv/files/data.txt /opt/app.txt; echo $G; id -un; pwd; stat -c %U /srv/files/data.txt", client.ExecOptions{})
	want := "from the context\ncompiled\nhello world\nuser\n/srv\nroot\n"
	if err != nil || out.Stdout != want {
		t.Errorf("in the built template: %q %s (%v), want %q", out.Stdout, out.Stderr, err, want)
	}
}
