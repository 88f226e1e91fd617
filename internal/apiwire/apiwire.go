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

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
)

//go:embed openapi.yaml
var document []byte

// YAML is the document as it is written, comments included.
func YAML() []byte { return document }

// Load parses the document. Every call returns a new copy, which the caller
// may change.
func Load() (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromData(document)
	if err != nil {
		return nil, fmt.Errorf("apiwire: load the OpenAPI document: %w", err)
	}
	return doc, nil
}

var asJSON = sync.OnceValues(func() ([]byte, error) {
	doc, err := Load()
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("apiwire: the OpenAPI document as JSON: %w", err)
	}
	return b, nil
})

// JSON is the document as JSON, what GET /openapi.json serves.
func JSON() ([]byte, error) { return asJSON() }

// Handler serves the document as JSON. It needs no API key: the document
// describes the API, it grants nothing.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := JSON()
		if err != nil {
			// The document is embedded and TestDocument loads it: only a
			// build that skipped the tests gets here.
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			w.WriteHeader(http.StatusInternalServerError)
			_ = json.NewEncoder(w).Encode(Error{Code: http.StatusInternalServerError, Message: err.Error()})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(b)
	})
}
