package sandbox

import (
	"slices"
	"testing"
)

func TestMetricsRingKeepsTheNewest(t *testing.T) {
	var r metricsRing
	at := func() []int64 {
		var out []int64
		for _, s := range r.ordered() {
			out = append(out, s.unixMilli)
		}
		return out
	}
	if got := at(); len(got) != 0 {
		t.Fatalf("empty ring: %v", got)
	}
	if s, ok := r.newest(); ok {
		t.Fatalf("empty ring: newest %+v", s)
	}
	newest := func() int64 { s, _ := r.newest(); return s.unixMilli }
	for i := int64(1); i <= 2; i++ {
		r.add(sample{unixMilli: i}, 3)
	}
	if got := at(); !slices.Equal(got, []int64{1, 2}) {
		t.Fatalf("before full: %v", got)
	}
	for i := int64(3); i <= 8; i++ {
		r.add(sample{unixMilli: i}, 3)
		if got := at(); len(got) != 3 || got[2] != i || !slices.IsSorted(got) || newest() != i {
			t.Fatalf("after adding %d: %v", i, got)
		}
	}
	if got := at(); !slices.Equal(got, []int64{6, 7, 8}) {
		t.Fatalf("full ring: %v, want the newest three oldest first", got)
	}
	if got := newest(); got != 8 {
		t.Fatalf("newest = %d, want 8", got)
	}
}
