//go:build ignore

// genjson writes openapi.json, the document as GET /openapi.json serves it,
// from openapi.yaml (go generate; TestJSONUpToDate checks it).
package main

import (
	"encoding/json"
	"log"
	"os"

	"github.com/cella-sandbox/cella/internal/apiwire/spec"
)

func main() {
	doc, err := spec.Load()
	if err != nil {
		log.Fatal(err)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("openapi.json", append(b, '\n'), 0o644); err != nil {
		log.Fatal(err)
	}
}
