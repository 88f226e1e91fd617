package api

import (
	"slices"
	"testing"
	"time"
)

// TestCreateCounts: creates land in their minute, the window is the last
// 60 minutes oldest first, and a minute's slot reused an hour later starts
// from zero (the ring forgets what is older than the window).
func TestCreateCounts(t *testing.T) {
	var c createCounts
	t0 := time.Unix(1_000_000_040, 0) // 20 s into a minute
	c.add(t0, 2)
	c.add(t0.Add(45*time.Second), 1) // the next minute
	c.add(t0.Add(5*time.Minute), 4)
	start, got := c.last(t0.Add(5 * time.Minute))
	if len(got) != createsWindow {
		t.Fatalf("len %d", len(got))
	}
	if want := (t0.Unix()/60 - createsWindow + 6) * 60; start != want {
		t.Fatalf("start %d, want %d", start, want)
	}
	want := make([]int, createsWindow)
	want[createsWindow-6], want[createsWindow-5], want[createsWindow-1] = 2, 1, 4
	if !slices.Equal(got, want) {
		t.Fatalf("counts %v, want %v", got, want)
	}
	// An hour on, the first minute's slot is reused: its old count (2) is
	// gone, the minutes still in the window keep theirs.
	later := t0.Add(time.Hour)
	c.add(later, 7)
	_, got = c.last(later)
	want = make([]int, createsWindow)
	want[0], want[4], want[createsWindow-1] = 1, 4, 7
	if !slices.Equal(got, want) {
		t.Fatalf("an hour later: %v, want %v", got, want)
	}
}
