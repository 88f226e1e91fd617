package apiwire_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/cella-sandbox/cella/internal/apiwire"
	"github.com/cella-sandbox/cella/internal/apiwire/spec"
)

// TestDocument: the document is valid OpenAPI 3 (kin-openapi's validation:
// references resolve, schemas are well formed, operation IDs unique, path
// parameters declared), and every operation says what it answers.
func TestDocument(t *testing.T) {
	doc, err := spec.Load()
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the OpenAPI document does not validate: %v", err)
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.OperationID == "" || op.Summary == "" {
				t.Errorf("%s %s: no operationId or summary", method, path)
			}
			if op.Responses == nil || op.Responses.Len() == 0 {
				t.Errorf("%s %s: no responses", method, path)
			}
		}
	}
}

// TestHandler: GET /openapi.json is the document, as JSON that loads back
// to the same paths and schemas.
func TestHandler(t *testing.T) {
	rec := httptest.NewRecorder()
	apiwire.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/openapi.json", nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("GET /openapi.json: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	if !bytes.HasPrefix(rec.Body.Bytes(), []byte("{")) {
		t.Fatalf("not JSON: %.80s", rec.Body)
	}
	got, err := openapi3.NewLoader().LoadFromData(rec.Body.Bytes())
	if err != nil {
		t.Fatalf("the served JSON does not load: %v", err)
	}
	want, _ := spec.Load()
	if g, w := got.Paths.InMatchingOrder(), want.Paths.InMatchingOrder(); !slices.Equal(g, w) {
		t.Fatalf("served paths %v, want %v", g, w)
	}
	for name := range want.Components.Schemas {
		if got.Components.Schemas[name] == nil {
			t.Errorf("schema %s is missing from the served JSON", name)
		}
	}
	if got.Info.Title != want.Info.Title || got.Extensions == nil && want.Extensions != nil {
		t.Errorf("info %+v, want %+v", got.Info, want.Info)
	}
	// Vendor extensions survive: they say what is cella's.
	if !strings.Contains(rec.Body.String(), `"x-cella":true`) {
		t.Error("the served JSON lost the x-cella extensions")
	}
}

// TestGeneratedUpToDate: apiwire.gen.go is what the pinned oapi-codegen
// (tools/oapi-codegen/go.mod) makes of the document today. Fix a failure
// with `make api`.
func TestGeneratedUpToDate(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to run the generator: %v", err)
	}
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	tools := filepath.Join(here, "..", "..", "tools", "oapi-codegen")
	out := filepath.Join(t.TempDir(), "apiwire.gen.go")
	cmd := exec.Command(goBin, "-C", tools, "tool", "oapi-codegen",
		"-config", filepath.Join(here, "codegen.yaml"), "-o", out, filepath.Join(here, "openapi.yaml"))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, b)
	}
	want, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("apiwire.gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("apiwire.gen.go is stale (run make api): line %d is\n\t%s\nthe generator writes\n\t%s", i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("apiwire.gen.go is stale (run make api): %d lines, the generator writes %d", len(gl), len(wl))
	}
}

// TestJSONUpToDate: openapi.json, what the daemon serves, is the YAML
// document as JSON. Fix a failure with `make api`.
func TestJSONUpToDate(t *testing.T) {
	doc, err := spec.Load()
	if err != nil {
		t.Fatal(err)
	}
	want, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	if got := bytes.TrimSpace(apiwire.JSON()); !bytes.Equal(got, want) {
		t.Fatalf("openapi.json is stale (run make api): %d bytes, the YAML makes %d", len(got), len(want))
	}
}
