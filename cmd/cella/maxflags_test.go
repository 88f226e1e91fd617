package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/cella-sandbox/cella/internal/sandbox"
)

// TestMaxFlags: the maxima come from CELLA_MAX_* and the flags (sizes like
// 16G); a value that does not parse, or a size that would overflow, is an
// error naming it, and serve refuses to start with it.
func TestMaxFlags(t *testing.T) {
	t.Setenv("CELLA_MAX_CPUS", "1.5")
	t.Setenv("CELLA_MAX_MEMORY", "16G")
	t.Setenv("CELLA_MAX_DISK", "2048")
	t.Setenv("CELLA_MAX_PIDS", "4096")
	var m sandbox.Maxima
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	if err := registerMaxFlags(fs, &m); err != nil {
		t.Fatal(err)
	}
	if want := (sandbox.Maxima{CPUs: 1.5, MemoryMB: 16384, DiskMB: 2048, Pids: 4096}); m != want {
		t.Fatalf("from the environment: %+v, want %+v", m, want)
	}
	if err := fs.Parse([]string{"--max-memory", "512M", "--max-disk", "0", "--max-cpus", "8"}); err != nil {
		t.Fatal(err)
	}
	if want := (sandbox.Maxima{CPUs: 8, MemoryMB: 512, DiskMB: 0, Pids: 4096}); m != want {
		t.Fatalf("flags over the environment: %+v, want %+v", m, want)
	}
	for _, bad := range []string{"--max-memory=9007199254740993G", "--max-memory=lots", "--max-cpus=NaN", "--max-cpus=-1", "--max-pids=-5"} {
		if err := fs.Parse([]string{bad}); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
	t.Setenv("CELLA_MAX_PIDS", "many")
	if err := registerMaxFlags(pflag.NewFlagSet("serve", pflag.ContinueOnError), &m); err == nil || !strings.Contains(err.Error(), "CELLA_MAX_PIDS") {
		t.Fatalf("a bad CELLA_MAX_PIDS: %v", err)
	}
	c := newServeCmd()
	if err := c.RunE(c, nil); err == nil || !strings.Contains(err.Error(), "CELLA_MAX_PIDS") {
		t.Fatalf("serve with a bad CELLA_MAX_PIDS: %v", err)
	}
}
