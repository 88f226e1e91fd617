// Package spec loads cella's OpenAPI document (internal/apiwire) for the
// programs that reason about it: tests that hold the server to it and the
// generator of the served JSON. It is kept apart from apiwire so that the
// daemon, and the agent in every sandbox, which are the same binary, do not
// carry an OpenAPI library and its start-up work.
package spec

import (
	"fmt"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/cella-sandbox/cella/internal/apiwire"
)

// Load parses the document. Every call returns a new copy, which the caller
// may change.
func Load() (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromData(apiwire.YAML())
	if err != nil {
		return nil, fmt.Errorf("apiwire: load the OpenAPI document: %w", err)
	}
	return doc, nil
}
