package api_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/template"
)

// listedTemplate is a GET /templates item with cella's store fields.
type listedTemplate struct {
	TemplateID  string   `json:"templateID"`
	Aliases     []string `json:"aliases"`
	BuildStatus string   `json:"buildStatus"`
	StoreName   string   `json:"storeName"`
	Source      *struct {
		Kind        string   `json:"kind"`
		Description string   `json:"description"`
		ImageRef    string   `json:"imageRef"`
		Packages    []string `json:"packages"`
	} `json:"source"`
	SizeBytes  int64 `json:"sizeBytes"`
	LayerCount int   `json:"layerCount"`
	Layers     []struct {
		ID        string `json:"id"`
		Kind      string `json:"kind"`
		SizeBytes int64  `json:"sizeBytes"`
	} `json:"layers"`
}

// GET /templates says of each template where it is in the template store,
// what it was made from, its size and its layers, as the store itself
// reports them: for the builtin base and for a template built over E2B's
// API (through its build's store name); a template with no ready build has
// none of it; no host path is in the answer.
func TestTemplateListStoreFields(t *testing.T) {
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{})
	e := e2bT{apiT: apiT{env: env}, t: t}
	tpls, err := template.NewStore(daemontest.CacheDir())
	if err != nil {
		t.Fatal(err)
	}
	// A build of one step on base (the step is this run's own, so a real
	// layer is made even when the shared cache has seen this test before).
	tb := &client.TemplateBuilds{C: env.Client, Log: func(build.LogEntry) {}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := fmt.Sprintf("echo listed-%d > /home/user/listed", time.Now().UnixNano())
	if err := tb.Build(ctx, build.Spec{Name: "listed-fields", Base: build.Base{Template: "base"},
		Steps: []build.Step{{Type: build.StepRun, Args: []string{run}}}}, nil); err != nil {
		t.Fatal(err)
	}
	waiting := e.request(env.APIKey, "listed-waiting")
	// An imported directory: its host path is the store's, not the API's.
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	imported := fmt.Sprintf("listed-import-%d", time.Now().UnixNano())
	if _, err := tpls.Import(imported, src); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tpls.Delete(imported) })
	// Removed even when a check fails: the template cache is shared.
	t.Cleanup(func() {
		for _, ref := range []string{"listed-fields", waiting.TemplateID} {
			e.do(t, "DELETE", "/templates/"+ref, env.APIKey, nil, nil)
		}
	})

	var list []listedTemplate
	body := e.json("GET", "/templates", env.APIKey, nil, 200, &list)
	for _, host := range []string{daemontest.CacheDir(), src} {
		if strings.Contains(string(body), host) {
			t.Fatalf("the answer names the host path %s: %s", host, body)
		}
	}
	byID := map[string]listedTemplate{}
	for _, l := range list {
		byID[l.TemplateID] = l
		if l.Aliases[0] == "listed-fields" {
			byID["listed-fields"] = l
		}
	}
	check := func(l listedTemplate, kind string) *template.Template {
		t.Helper()
		st, err := tpls.Get(l.StoreName)
		if err != nil {
			t.Fatalf("%s: store name %q: %v", l.TemplateID, l.StoreName, err)
		}
		if l.Source == nil || l.Source.Kind != kind || l.Source.Description != st.Describe() {
			t.Fatalf("%s: source %+v, want kind %s, %q", l.TemplateID, l.Source, kind, st.Describe())
		}
		if l.SizeBytes <= 0 || (st.Size > 0 && l.SizeBytes != st.Size) {
			t.Fatalf("%s: sizeBytes %d, the store records %d", l.TemplateID, l.SizeBytes, st.Size)
		}
		if l.LayerCount != len(st.Lowers()) || len(l.Layers) != l.LayerCount {
			t.Fatalf("%s: %d layers (%d listed), the store stacks %d", l.TemplateID, l.LayerCount, len(l.Layers), len(st.Lowers()))
		}
		return st
	}

	base, ok := byID["base"]
	if !ok {
		t.Fatalf("base is not listed: %s", body)
	}
	check(base, template.SourceBuiltin)
	if base.StoreName != "base" || !slices.Equal(base.Source.Packages, template.BaseRecipe.Packages) ||
		base.Layers[0].Kind != "rootfs" || base.Layers[0].SizeBytes != base.SizeBytes {
		t.Fatalf("base: %+v", base)
	}

	built, ok := byID["listed-fields"]
	if !ok {
		t.Fatalf("the API template is not listed: %s", body)
	}
	if !strings.HasPrefix(built.StoreName, "e2b."+built.TemplateID+".") {
		t.Fatalf("API template's store name %q", built.StoreName)
	}
	check(built, template.SourceBuild)
	// Its stack is its step's layer over base's.
	if built.LayerCount != base.LayerCount+1 || built.Layers[0].Kind != "layer" || !strings.HasPrefix(built.Layers[0].ID, "sha256:") ||
		built.Layers[len(built.Layers)-1].ID != base.Layers[0].ID || built.SizeBytes < base.SizeBytes {
		t.Fatalf("built on base: %+v\nbase: %+v", built, base)
	}

	// The build is one sample of the template build histogram, under its
	// template's ID (not its per-build store name: one series a template).
	fams := e.scrape(t)
	if n := histCount(fams, "cella_template_build_duration_seconds", map[string]string{"template": built.TemplateID, "runtime": runtime.GVisor}); n != 1 {
		t.Errorf("cella_template_build_duration_seconds{template=%s}: count %d, want 1", built.TemplateID, n)
	}
	for _, m := range fams["cella_template_build_duration_seconds"].GetMetric() {
		for _, l := range m.GetLabel() {
			if strings.HasPrefix(l.GetValue(), "e2b.") {
				t.Errorf("a build's store name is a label: %v", m)
			}
		}
	}

	imp, ok := byID[imported]
	if !ok || imp.Source == nil || imp.Source.Kind != template.SourceImport || imp.LayerCount != 1 || imp.Layers[0].Kind != "rootfs" {
		t.Fatalf("imported template: %+v", imp)
	}

	w, ok := byID[waiting.TemplateID]
	if !ok || w.BuildStatus != "waiting" || w.StoreName != "" || w.Source != nil || w.LayerCount != 0 || w.SizeBytes != 0 {
		t.Fatalf("a template without a ready build: %+v", w)
	}
}
