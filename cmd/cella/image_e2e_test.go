package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/image/registrytest"
	"github.com/cella-sandbox/cella/internal/template"
)

// baseImages are images made from the base template's files: python (base
// plus a small layer), and one whose small layer removes bash, the
// template user and its home (the finalize layer must bring them back).
func baseImages(t *testing.T) (python, nobash v1.Image) {
	t.Helper()
	daemontest.EnsureBase(t)
	s, err := template.NewStore(daemontest.CacheDir())
	if err != nil {
		t.Fatal(err)
	}
	base, err := s.Get(template.BaseName)
	if err != nil {
		t.Fatal(err)
	}
	passwd, err := os.ReadFile(filepath.Join(base.RootFS, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	var keep []string
	for _, l := range strings.Split(strings.TrimSpace(string(passwd)), "\n") {
		if !strings.HasPrefix(l, "user:") {
			keep = append(keep, l)
		}
	}
	bottom := registrytest.DirLayer(t, base.RootFS)
	small := registrytest.Layer(t, registrytest.TarOf(t, registrytest.File{Name: "srv", Dir: true},
		registrytest.File{Name: "srv/hello.py", Body: "print(6*7)\n"}), registrytest.Gzip)
	strip := registrytest.Layer(t, registrytest.TarOf(t,
		registrytest.File{Name: "etc/passwd", Body: strings.Join(keep, "\n") + "\n"},
		registrytest.File{Name: "home/.wh.user"},
		registrytest.File{Name: "usr/bin/.wh.bash"}), registrytest.Zstd)
	cfg := v1.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "IMAGE_VAR=from-image"}}
	return registrytest.Image(t, cfg, bottom, small), registrytest.Image(t, cfg, bottom, strip)
}

// `cella template build py --from-image 127.0.0.1:PORT/python:test`, then
// `cella run --template py -- python3 ...`; the same from a docker-archive;
// an image without bash or a user account; rm refused while a sandbox uses
// a template; under gVisor and the namespaces runtime, one cache for both.
func TestCLIImageTemplates(t *testing.T) {
	reg := registrytest.Start(t)
	python, nobash := baseImages(t)
	reg.Push(t, "python:test", python)
	reg.Push(t, "nobash:test", nobash)
	reg.Push(t, "library/python:test", python) // what docker.io/python:test is on a mirror
	cache := t.TempDir()
	bin, _ := daemontest.Binaries(t)
	tpl := func(args ...string) (string, string) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"template", "--cache-dir", cache}, args...)...)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("cella template %v: %v\n%s%s", args, err, out.String(), errb.String())
		}
		return out.String(), errb.String()
	}
	_, progress := tpl("build", "py", "--from-image", reg.Ref("python:test"))
	if !strings.Contains(progress, "layer 1/2") || !strings.Contains(progress, "layer 2/2") || strings.Contains(progress, "cached") {
		t.Fatalf("pull progress:\n%s", progress)
	}
	t.Log(progress)

	dir := t.TempDir()
	archive := filepath.Join(dir, "python.tar")
	tag, _ := name.NewTag("python:test")
	if err := tarball.WriteToFile(archive, tag, python); err != nil {
		t.Fatal(err)
	}
	_, progress = tpl("build", "pyarchive", "--from-image", "docker-archive:"+archive)
	if strings.Count(progress, "cached (") != 2 {
		t.Fatalf("a docker-archive of the same image should find both layers cached:\n%s", progress)
	}
	// Docker Hub's python:test through a mirror (the flag cella serve has too).
	_, progress = tpl("build", "hub", "--from-image", "python:test", "--registry-mirror", "docker.io=http://"+reg.Addr)
	if !strings.Contains(progress, "via mirror http://"+reg.Addr) || strings.Count(progress, "cached (") != 2 {
		t.Fatalf("pull through the mirror:\n%s", progress)
	}
	_, progress = tpl("build", "nobash", "--from-image", reg.Ref("nobash:test"))
	if !strings.Contains(progress, "added user user") || !strings.Contains(progress, "shell /bin/sh") {
		t.Fatalf("finalize of nobash:\n%s", progress)
	}
	if out, _ := tpl("ls", "--local"); !strings.Contains(out, reg.Ref("python@sha256:")) || !strings.Contains(out, "pyarchive") || !strings.Contains(out, "nobash") {
		t.Fatalf("template ls:\n%s", out)
	}

	for _, rt := range []string{"gvisor", "namespaces"} {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, t.TempDir(), freePort(t), "--cache-dir", cache, "--runtime", rt)
			for _, name := range []string{"py", "pyarchive"} {
				if out := d.mustCella("run", "--template", name, "--", "python3", "-c", "print(42)"); out != "42\n" {
					t.Fatalf("%s: python3 printed %q", name, out)
				}
			}
			out := d.mustCella("run", "--template", "py", "--", "sh", "-c", "python3 /srv/hello.py; echo $IMAGE_VAR; id -un; pwd")
			if out != "42\nfrom-image\nuser\n/home/user\n" {
				t.Fatalf("py defaults: %q", out)
			}
			// Root in the sandbox rewrites and deletes the image's files: its
			// own layer changes, the shared layer store does not.
			d.mustCella("run", "--template", "py", "--user", "root", "--", "sh", "-c", "echo changed > /srv/hello.py && rm /etc/passwd")
			if out := d.mustCella("run", "--template", "py", "--", "sh", "-c", "python3 /srv/hello.py; test -e /etc/passwd && echo intact"); out != "42\nintact\n" {
				t.Fatalf("a sandbox changed the image for the next one: %q", out)
			}
			// No bash: commands run with sh, as the finalize layer's user.
			out = d.mustCella("run", "--template", "nobash", "--", "sh", "-c", "test -e /bin/bash || echo no bash; id -un; pwd; ls -ld /home/user | cut -d' ' -f3")
			if out != "no bash\nuser\n/home/user\nuser\n" {
				t.Fatalf("nobash: %q", out)
			}
			// rm is refused while a sandbox uses the template.
			id := strings.TrimSpace(d.mustCella("create", "--template", "pyarchive", "--timeout", "5m"))
			cmd := exec.Command(bin, "template", "--cache-dir", cache, "rm", "--local", "pyarchive")
			if b, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(b), "used by 1 sandbox") || !strings.Contains(string(b), id) {
				t.Fatalf("rm while in use: %v %s", err, b)
			}
			// A snapshot stacks on the image's layers, and a sandbox made from
			// it keeps that image even after the name is pointed elsewhere.
			d.mustCella("exec", id, "--", "sh", "-c", "echo kept > /home/user/state")
			snap := strings.TrimSpace(d.mustCella("snapshot", id))
			d.mustCella("kill", id)
			tpl("build", "pyarchive", "--from-image", reg.Ref("nobash:test"))
			out = d.mustCella("run", "--template", snap, "--", "sh", "-c", "cat /home/user/state; test -e /bin/bash && python3 -c 'print(42)'")
			if out != "kept\n42\n" {
				t.Fatalf("sandbox from a snapshot of an image template: %q", out)
			}
			tpl("build", "pyarchive", "--from-image", "docker-archive:"+archive)
			d.mustCella("snapshot", "rm", snap)
		})
	}
	tpl("rm", "--local", "pyarchive", "nobash", "py", "hub")
	// Nothing uses the layers any more: the store is empty.
	ents, _ := os.ReadDir(filepath.Join(cache, "layers", "sha256"))
	imgs, _ := os.ReadDir(filepath.Join(cache, "images"))
	var dirs []string
	for _, e := range imgs {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	if len(ents) != 0 || len(dirs) != 0 {
		t.Fatalf("after rm: layers %v, images %v", ents, dirs)
	}
}
