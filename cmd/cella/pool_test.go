package main

import (
	"maps"
	"testing"

	"github.com/spf13/pflag"
)

func TestPoolFlag(t *testing.T) {
	t.Setenv("CELLA_POOL", "base=1, code-interpreter-v1=2")
	var sizes map[string]int
	f := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	if err := registerPoolFlag(f, &sizes); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"base": 1, "code-interpreter-v1": 2}; !maps.Equal(sizes, want) {
		t.Fatalf("from CELLA_POOL: %v, want %v", sizes, want)
	}
	// --pool replaces the environment's list; it repeats and takes lists.
	if err := f.Parse([]string{"--pool", "base=3", "--pool", "py=0,node=1"}); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"base": 3, "py": 0, "node": 1}; !maps.Equal(sizes, want) {
		t.Fatalf("from --pool: %v, want %v", sizes, want)
	}
	for _, bad := range []string{"base", "base=x", "=2", "base=-1", "base=1000"} {
		if err := parsePoolSizes(bad, map[string]int{}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
