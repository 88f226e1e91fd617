package conformance

import (
	"testing"

	"github.com/cella-sandbox/cella/internal/runtime"
)

func TestGVisor(t *testing.T)     { Run(t, runtime.GVisor) }
func TestNamespaces(t *testing.T) { Run(t, runtime.Namespaces) }
