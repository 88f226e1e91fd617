package main

import (
	"os/exec"
	"strings"
	"testing"
)

// deps lists the packages pkg links (go list -deps).
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// TestLean: the agent links internal/agent and what it needs, nothing of
// the daemon, the CLI, the console or their libraries (a sandbox's cold
// start pages in the code of every package linked and runs its inits); and
// cella links no agent of its own, only the embedded binary.
func TestLean(t *testing.T) {
	const mod = "github.com/cella-sandbox/cella/"
	forbidden := []string{
		"github.com/spf13/cobra", "github.com/prometheus/", "modernc.org/sqlite", "k8s.io/",
		"github.com/google/go-containerregistry", "github.com/modelcontextprotocol/",
		mod + "internal/daemon", mod + "internal/api", mod + "internal/store", mod + "internal/sandbox",
		mod + "internal/runtime", mod + "internal/ui", mod + "internal/client", mod + "internal/egress",
		mod + "internal/network", mod + "internal/template", mod + "internal/mcpserver", mod + "internal/bench",
		mod + "internal/agentclient", mod + "internal/metrics",
	}
	agent := deps(t, ".")
	for _, p := range agent {
		for _, f := range forbidden {
			if p == f || strings.HasPrefix(p, strings.TrimSuffix(f, "/")+"/") {
				t.Errorf("cella-agent links %s", p)
			}
		}
	}
	t.Logf("cella-agent links %d packages", len(agent))
	for _, p := range deps(t, "../cella") {
		if p == mod+"internal/agent" || strings.HasPrefix(p, mod+"internal/agent/") {
			t.Errorf("cella links %s: the agent is cmd/cella-agent's, embedded through internal/agentbin", p)
		}
	}
}
