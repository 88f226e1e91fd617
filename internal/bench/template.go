package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/gzip"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/image/localregistry"
	"github.com/cella-sandbox/cella/internal/layerstore"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// benchImage is the template name the create figures pull into the cache.
const benchImage = "cella-bench-image"

// Template measures templates from OCI images: a pull of a 5-layer image
// (the base template's files as one layer, four layers of 8 MiB of
// incompressible files on top) from a local registry into an empty cache,
// the same pull again with every layer cached, and create → first exec
// from the pulled template beside the same from base, per runtime.
func Template(ctx context.Context, cfg Config) ([]Figure, error) {
	if cfg.N <= 0 {
		cfg.N = 20
	}
	tpls, base, err := ensureBase(ctx, cfg)
	if err != nil {
		return nil, err
	}
	regDir, err := os.MkdirTemp("", "cella-bench-registry-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(regDir)
	reg, err := localregistry.Run(regDir, "", "")
	if err != nil {
		return nil, err
	}
	defer reg.Stop()
	img, size, err := fiveLayers(base.RootFS)
	if err != nil {
		return nil, err
	}
	if _, err := reg.Push(ctx, "bench/image:5", img); err != nil {
		return nil, fmt.Errorf("push the bench image: %w", err)
	}
	ref := reg.Ref("bench/image:5")

	// Cold: a fresh cache each time (no layer present). Cached: the same
	// cache again, under another name.
	pulls := max(1, min(cfg.N/5, 3)) // --smoke (N=3): one
	var cold, cached []time.Duration
	for i := 0; i < pulls; i++ {
		dir, err := os.MkdirTemp("", "cella-bench-cache-")
		if err != nil {
			return nil, err
		}
		s, err := template.NewStore(dir)
		if err == nil {
			t0 := time.Now()
			if _, err = s.Pull(ctx, "cold", ref, template.PullOptions{}); err == nil {
				cold = append(cold, time.Since(t0))
				t0 = time.Now()
				if _, err = s.Pull(ctx, "cached", ref, template.PullOptions{}); err == nil {
					cached = append(cached, time.Since(t0))
				}
			}
		}
		os.RemoveAll(dir)
		if err != nil {
			return nil, fmt.Errorf("pull: %w", err)
		}
	}
	fc := summarize("template pull, 5 layers, cold", "", cold)
	fc.Extra = fmt.Sprintf("%d MiB compressed, %.0f MiB/s", size>>20, float64(size)/(1<<20)/fc.P50.Seconds())
	fk := summarize("template pull, 5 layers, all cached", "", cached)
	fk.against(fc)
	figs := []Figure{fc, fk}

	// Creates: the image template in the bench's cache, beside base.
	if _, err := tpls.Pull(ctx, benchImage, ref, template.PullOptions{}); err != nil {
		return figs, err
	}
	defer tpls.Delete(benchImage)
	for _, rt := range runtimesOf(cfg) {
		fb, fi, err := createsOf(ctx, cfg, rt)
		if err != nil {
			fi.Err = err.Error()
		}
		fi.against(fb)
		figs = append(figs, fb, fi)
		if rt == runtime.GVisor { // start commands need memory snapshots
			figs = append(figs, buildsOf(ctx, cfg, rt, fb)...)
		}
	}
	return figs, nil
}

// buildsOf times template builds on one daemon: a build of three RUN steps,
// its rebuild with every step cached (against the build), and create →
// first answer from a template whose start command (a Python HTTP server)
// was captured running, against a plain create → first exec (plain).
func buildsOf(ctx context.Context, cfg Config, rt string, plain Figure) []Figure {
	fBuild := Figure{Name: "template build, 3 RUN steps (one sandbox each)", Runtime: rt}
	fCached := Figure{Name: "template rebuild, every step cached", Runtime: rt}
	fSnap := Figure{Name: "cella create from a start-command snapshot → first HTTP answer", Runtime: rt}
	fail := func(err error) []Figure {
		for _, f := range []*Figure{&fBuild, &fCached, &fSnap} {
			f.Err = err.Error()
		}
		return []Figure{fBuild, fCached, fSnap}
	}
	l, err := startLocal(ctx, cfg, rt)
	if err != nil {
		return fail(err)
	}
	defer l.Close()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	team := tenant.Principal{Key: "bench", Team: fmt.Sprintf("bench-%x", b)}
	name := fmt.Sprintf("cella-bench-build-%x", b)
	defer l.Daemon.Templates.Delete(name)
	spec := build.Spec{Name: name, Base: build.Base{Template: "base"}, Steps: []build.Step{
		{Type: "RUN", Args: []string{"mkdir -p ~/a && echo one > ~/a/x"}},
		{Type: "RUN", Args: []string{"echo two >> ~/a/x"}},
		{Type: "RUN", Args: []string{"mkdir -p /srv/www && echo ok > /srv/www/index.html", "root"}},
	}}
	t0 := time.Now()
	if _, err := l.Daemon.Builder.Build(ctx, team, spec, nil, nil); err != nil {
		return fail(err)
	}
	fBuild = summarize(fBuild.Name, rt, []time.Duration{time.Since(t0)})
	var cached []time.Duration
	for range max(1, min(cfg.N, 5)) {
		t0 := time.Now()
		res, err := l.Daemon.Builder.Build(ctx, team, spec, nil, nil)
		if err == nil && len(res.Cached) != len(spec.Steps)+1 {
			err = fmt.Errorf("a rebuild ran steps: cached %v", res.Cached)
		}
		if err != nil {
			return fail(err)
		}
		cached = append(cached, time.Since(t0))
	}
	fCached = summarize(fCached.Name, rt, cached)
	fCached.against(fBuild)

	spec.StartCmd = "exec python3 -m http.server 8000 --directory /srv/www"
	spec.ReadyCmd = "curl -sf http://127.0.0.1:8000/ >/dev/null"
	if _, err := l.Daemon.Builder.Build(ctx, team, spec, nil, nil); err != nil {
		fSnap.Err = err.Error()
		return []Figure{fBuild, fCached, fSnap}
	}
	var snap []time.Duration
	for range cfg.N {
		t0 := time.Now()
		sb, err := l.Client.Create(ctx, client.CreateRequest{TemplateID: name})
		if err == nil {
			err = firstAnswer(ctx, l.URL, sb.SandboxID, 8000)
			_ = l.Client.Kill(ctx, sb.SandboxID)
		}
		if err != nil {
			fSnap.Err = err.Error()
			return []Figure{fBuild, fCached, fSnap}
		}
		snap = append(snap, time.Since(t0))
	}
	fSnap = summarize(fSnap.Name, rt, snap)
	fSnap.against(plain)
	return []Figure{fBuild, fCached, fSnap}
}

// firstAnswer makes one request to port of sandbox id through the daemon's
// proxy and wants a 200: no retry, the server must be up already.
func firstAnswer(ctx context.Context, base, id string, port int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/", nil)
	if err != nil {
		return err
	}
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", fmt.Sprint(port))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the first request to port %d answered %s", port, resp.Status)
	}
	return nil
}

// createsOf times create → first exec from base and from the bench image,
// alternating, on one daemon.
func createsOf(ctx context.Context, cfg Config, rt string) (fromBase, fromImage Figure, err error) {
	l, err := startLocal(ctx, cfg, rt)
	if err != nil {
		return Figure{Name: "create from base", Runtime: rt}, Figure{Name: "create from image", Runtime: rt}, err
	}
	defer l.Close()
	var b, i []time.Duration
	for n := 0; n < cfg.N; n++ {
		for _, tc := range []struct {
			tpl string
			out *[]time.Duration
		}{{"base", &b}, {benchImage, &i}} {
			took, _, e := createThenExecOf(ctx, l.Client, client.CreateRequest{TemplateID: tc.tpl})
			if e != nil {
				err = e
				continue
			}
			*tc.out = append(*tc.out, took)
		}
	}
	return summarize("cella create → first exec done (base, 1 layer)", rt, b),
		summarize("cella create → first exec done (image template, 5 layers)", rt, i), err
}

// fiveLayers is the bench image and its compressed size.
func fiveLayers(baseRoot string) (v1.Image, int64, error) {
	var layers []v1.Layer
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(layerstore.WriteTar(pw, baseRoot)) }()
		return pr, nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return nil, 0, err
	}
	layers = append(layers, l)
	for i := range 4 {
		dir, err := os.MkdirTemp("", "cella-bench-layer-")
		if err != nil {
			return nil, 0, err
		}
		for f := range 32 {
			b := make([]byte, 256<<10)
			rand.Read(b)
			if err = os.WriteFile(fmt.Sprintf("%s/layer%d-file%d", dir, i, f), b, 0o644); err != nil {
				break
			}
		}
		var tb bytes.Buffer
		if err == nil {
			err = layerstore.WriteTar(&tb, dir)
		}
		os.RemoveAll(dir)
		if err != nil {
			return nil, 0, err
		}
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tb.Bytes())), nil },
			tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithCompressedCaching)
		if err != nil {
			return nil, 0, err
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, 0, err
	}
	var size int64
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			return nil, 0, err
		}
		size += n
	}
	return img, size, nil
}
