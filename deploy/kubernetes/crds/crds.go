// Package crds holds cella's CustomResourceDefinitions as they are
// deployed (kubectl apply -f deploy/kubernetes/crds/), embedded so the
// tests install exactly these files.
package crds

import "embed"

// FS holds every *.yaml of this directory.
//
//go:embed *.yaml
var FS embed.FS
