package dockerfile

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func steps(s Stage) []string {
	var out []string
	for _, st := range s.Spec.Steps {
		out = append(out, st.Type+" "+strings.Join(st.Args, "|"))
	}
	return out
}

func TestParseE2BExample(t *testing.T) {
	// The example of E2B's fromDockerfile (§3.2), with ARG defaults and a
	// build arg.
	df := `FROM node:20-bookworm
ARG VERSION
ARG LEVEL=3
ENV A=1 B=2
ENV C 3
ENV D=${LEVEL}x
WORKDIR /srv
COPY --chown=node:node app/config.json /srv/
RUN npm ci && echo ok
RUN ["echo", "exec form", "$HOME"]
USER node
EXPOSE 3000
LABEL a=b
CMD ["node","index.js"]
`
	var notes []string
	p, err := Parse(strings.NewReader(df), Options{Name: "app", BuildArgs: map[string]string{"VERSION": "7"}, Log: func(s string) { notes = append(notes, s) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Stages) != 1 {
		t.Fatalf("%d stages", len(p.Stages))
	}
	s := p.Stages[0]
	want := []string{"USER root", "WORKDIR /", "ENV VERSION|7", "ENV LEVEL|3", "ENV A|1|B|2", "ENV C|3", "ENV D|3x", "WORKDIR /srv",
		"COPY app/config.json|/srv/|node:node|", "RUN npm ci && echo ok", `RUN echo 'exec form' '$HOME'`, "USER node"}
	if got := steps(s); !slices.Equal(got, want) {
		t.Errorf("steps\n%q\nwant\n%q", got, want)
	}
	if s.Spec.Base.Image != "node:20-bookworm" || s.Spec.StartCmd != "node index.js" || s.Spec.Name != "app" {
		t.Errorf("spec %+v", s.Spec)
	}
	if len(notes) != 2 || !strings.Contains(notes[0], "Dockerfile:12: EXPOSE is ignored") {
		t.Errorf("notes %q", notes)
	}
	if src := s.Sources[8]; src.Stage != -1 || src.Paths[0] != "app/config.json" {
		t.Errorf("source of the COPY: %+v", s.Sources)
	}
}

func TestParseRefuses(t *testing.T) {
	for df, want := range map[string]string{
		"FROM base\nRUN true\n\n\n\n\nHEALTHCHECK CMD true\n": "Dockerfile:7: HEALTHCHECK is not supported",
		"FROM base\nSHELL [\"/bin/sh\", \"-c\"]\n":            "Dockerfile:2: SHELL is not supported",
		"RUN true\n": "Dockerfile:1: RUN before the first FROM",
		"FROM base\nCOPY --from=nginx /etc/x /x\n":           "only an earlier stage",
		"FROM base\nADD https://example.com/x /x\n":          "ADD of a URL is not supported",
		"FROM base\nCOPY ../secret /x\n":                     "outside the build context",
		"FROM base\nRUN --mount=type=cache,target=/x true\n": "RUN --mount is not supported",
	} {
		_, err := Parse(strings.NewReader(df), Options{Name: "x"})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", df, err, want)
		}
	}
}

func TestParseMultiStage(t *testing.T) {
	df := `ARG BASE=template:base
FROM ${BASE} AS builder
RUN mkdir -p /out && echo built > /out/app
FROM base AS unused
RUN echo never
FROM builder AS tester
RUN true
FROM template:base
COPY --from=builder /out/app /usr/local/bin/app
COPY --from=tester /etc/hostname /x
`
	p, err := Parse(strings.NewReader(df), Options{Name: "multi"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range p.Stages {
		names = append(names, s.Name+"<-"+s.Spec.Base.Template+s.Spec.Base.Image)
	}
	want := []string{"multi-stage-0<-base", "multi-stage-1<-multi-stage-0", "multi<-base"}
	if !slices.Equal(names, want) {
		t.Errorf("stages %q, want %q (the unused one left out)", names, want)
	}
	last := p.Stages[2]
	if src := last.Sources[2]; src.Stage != 0 || src.Paths[0] != "/out/app" || last.Spec.Steps[2].Args[0] != "app" {
		t.Errorf("COPY --from=builder: %+v %v", src, last.Spec.Steps[2].Args)
	}
	if src := last.Sources[3]; src.Stage != 1 {
		t.Errorf("COPY --from=tester: %+v", src)
	}
}

func TestContextArchive(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "app/sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "app/sub/a.py"), []byte("a"), 0o644)
	os.WriteFile(filepath.Join(dir, "app/b.txt"), []byte("b"), 0o600)
	os.Symlink("/etc/passwd", filepath.Join(dir, "link"))
	b, err := ContextArchive(dir, []string{"app/sub", "link", "app/*.txt"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name+":"+h.Linkname)
	}
	want := []string{"app/:", "app/sub/:", "app/sub/a.py:", "link:/etc/passwd", "app/b.txt:"}
	if !slices.Equal(names, want) {
		t.Errorf("archive %q, want %q", names, want)
	}
	if _, err := ContextArchive(dir, []string{"nothing*"}); err == nil {
		t.Errorf("no error for a source that matches nothing")
	}
}
