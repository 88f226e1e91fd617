package conformance

import (
	"testing"

	"github.com/cella-sandbox/cella/internal/runtime"
)

func TestSnapshotsGVisor(t *testing.T)     { RunSnapshots(t, runtime.GVisor) }
func TestSnapshotsNamespaces(t *testing.T) { RunSnapshots(t, runtime.Namespaces) }
