package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestDemandPeak(t *testing.T) {
	var d demandMeter
	t0 := time.Unix(1000, 0)
	// A burst of 50 within half a second, then one a second for ten
	// seconds: the peak is the burst.
	for i := range 50 {
		d.add(t0.Add(time.Duration(i) * 10 * time.Millisecond))
	}
	for i := range 10 {
		d.add(t0.Add(2*time.Second + time.Duration(i)*time.Second))
	}
	if got := d.peak(t0.Add(15 * time.Second)); got != 50 {
		t.Fatalf("peak = %d, want 50", got)
	}
	// Once the burst is older than the window only the steady creates
	// count, and after them nothing.
	if got := d.peak(t0.Add(demandWindow + time.Second)); got != 1 {
		t.Fatalf("peak after the burst aged out = %d, want 1", got)
	}
	if got := d.peak(t0.Add(demandWindow + 20*time.Second)); got != 0 {
		t.Fatalf("peak after everything aged out = %d, want 0", got)
	}
	// What it remembers is bounded.
	for i := range 10 * demandKeep {
		d.add(t0.Add(time.Hour + time.Duration(i)))
	}
	if len(d.arrivals) > demandKeep {
		t.Fatalf("%d arrivals kept, bound %d", len(d.arrivals), demandKeep)
	}
}

func TestPoolTarget(t *testing.T) {
	now := time.Unix(5000, 0)
	burst := func(p *pool, n int) {
		for i := range n {
			p.demand.add(now.Add(-time.Duration(i) * time.Millisecond))
		}
	}
	p := &pool{template: "base", size: 2, memEach: 10 << 20}
	if got := p.target(now, 1<<40); got != 2 {
		t.Fatalf("no demand: target %d, want the set size 2", got)
	}
	burst(p, 50)
	if got := p.target(now, 1<<40); got != 50 {
		t.Fatalf("after a burst of 50: target %d", got)
	}
	// The budget bounds the growth: room for 3 more than it holds.
	p.ready = make([]*pooled, 4)
	if got := p.target(now, 3*(10<<20)); got != 7 {
		t.Fatalf("within a budget for 3 more: target %d, want 7", got)
	}
	// The set size always holds, and MaxPoolSize bounds the peak.
	if got := p.target(now, 0); got != 4 {
		t.Fatalf("no spare budget: target %d, want what it holds (4)", got)
	}
	burst(p, 200)
	p.ready = nil
	if got := p.target(now, 1<<40); got != MaxPoolSize {
		t.Fatalf("after a burst of 250: target %d, want %d", got, MaxPoolSize)
	}
	// A removed pool (size 0) wants nothing, demand or not.
	p.size = 0
	if got := p.target(now, 1<<40); got != 0 {
		t.Fatalf("size 0: target %d", got)
	}
}

// The filler fills a pool toward its demand, several at a time, and only
// as far as the budget allows; what was grown beyond the set size counts
// against the budget.
func TestPoolFillsTowardDemand(t *testing.T) {
	ps := &poolSet{byTpl: map[string]*pool{}, budget: 5 * (10 << 20)}
	p := &pool{template: "base", size: 1, memEach: 10 << 20}
	ps.byTpl["base"] = p
	for range 20 {
		p.demand.add(time.Now())
	}
	var started int
	for {
		got, _ := ps.next(time.Now())
		if got == nil {
			break
		}
		started++
	}
	// The set size plus what the budget pays for: 1 + 5.
	if started != 6 || p.filling != 6 {
		t.Fatalf("%d fills started (filling %d), want 6", started, p.filling)
	}
	for i := range 6 {
		if d := ps.put(p, &pooled{sb: &Sandbox{ID: "x"}, memory: 10 << 20}, nil, false); d != nil {
			t.Fatalf("fill %d discarded", i)
		}
	}
	if len(p.ready) != 6 || p.filling != 0 || p.fills.idle != nil {
		t.Fatalf("after the fills: ready %d filling %d", len(p.ready), p.filling)
	}
	if spare := ps.spareLocked(); spare != 0 {
		t.Fatalf("spare budget %d, want 0", spare)
	}
}

func TestColdQueue(t *testing.T) {
	q := newColdQueue(1)
	release, err := q.wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := q.wait(ctx); err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "1 cold start slots") {
		t.Fatalf("a full queue with a cancelled context: %v", err)
	}
	got := make(chan struct{})
	go func() {
		r, err := q.wait(context.Background())
		if err == nil {
			r()
		}
		close(got)
	}()
	release()
	<-got // the waiter got its turn once the slot was released
}
