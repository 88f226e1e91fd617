// Package apiwire is cella's REST contract: the OpenAPI 3 document of the
// daemon's API (openapi.yaml: every route, request and answer, E2B's and
// cella's own) and the Go types of its requests and answers, generated from
// the document by oapi-codegen (apiwire.gen.go; `make api` or `go generate`
// regenerates it, TestGeneratedUpToDate fails when it is stale). The daemon
// serves the document as JSON at GET /openapi.json (Handler), and
// internal/api checks that the routes it registers are the document's
// (TestOpenAPIRoutes) and that its answers conform to it.
//
// The package knows nothing of HTTP handlers or sandboxes: it is the shape
// of the wire, shared by the server (internal/api) and its Go client
// (internal/client).
package apiwire

//go:generate go -C ../../tools/oapi-codegen tool oapi-codegen -config ../../internal/apiwire/codegen.yaml -o ../../internal/apiwire/apiwire.gen.go ../../internal/apiwire/openapi.yaml
//go:generate go run genjson.go

import (
	_ "embed"
	"net/http"
)

//go:embed openapi.yaml
var document []byte

// documentJSON is the document as JSON (genjson.go writes it from the YAML;
// TestJSONUpToDate checks it): served as it is, so that no OpenAPI library
// is in the binary (internal/apiwire/spec loads the document for tests).
//
//go:embed openapi.json
var documentJSON []byte

// YAML is the document as it is written, comments included.
func YAML() []byte { return document }

// JSON is the document as JSON, what GET /openapi.json serves.
func JSON() []byte { return documentJSON }

// Handler serves the document as JSON. It needs no API key: the document
// describes the API, it grants nothing.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(documentJSON)
	})
}
