package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/gzip"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/image/localregistry"
	"github.com/cella-sandbox/cella/internal/layerstore"
	"github.com/cella-sandbox/cella/internal/template"
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
	}
	return figs, nil
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
