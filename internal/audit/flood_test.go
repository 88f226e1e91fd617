package audit_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/audit"
)

// counts tallies a sandbox's entries by class, not counting the log's notes.
func counts(entries []audit.Entry) (blocked, allowed, other int64) {
	for _, e := range entries {
		switch {
		case e.Dropped != nil:
		case e.Decision == audit.DecisionBlocked:
			blocked++
		case e.Decision == audit.DecisionAllowed:
			allowed++
		default:
			other++
		}
	}
	return
}

// TestFloodIsBoundedAndCounted: after a blocked request, a sandbox floods
// the proxy with blocked and allowed lookups. The early block stays; past
// each budget's burst the log records at its rate, and what it held back is
// summed up, so that recorded plus held back is every decision, and the
// blocked budget is not spent by allowed decisions.
func TestFloodIsBoundedAndCounted(t *testing.T) {
	const rate, burst, flood = 10, 20, 5000
	l, _ := newLog(t, audit.Options{Rate: rate, Burst: burst})
	early := time.Now()
	l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindConnect, Source: audit.SourceProxy, Decision: audit.DecisionBlocked,
		Host: "evidence.test", Rule: "no-match", Reason: "the early block"})
	l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindProcessStart, Source: audit.SourceAgent, Cmd: "flood"})
	start := time.Now()
	for i := range flood {
		l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindDNS, Source: audit.SourceProxy, Decision: audit.DecisionAllowed, Host: fmt.Sprintf("a%d.test", i)})
		l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindDNS, Source: audit.SourceProxy, Decision: audit.DecisionBlocked, Host: fmt.Sprintf("b%d.test", i)})
	}
	elapsed := time.Since(start)
	l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindProcessExit, Source: audit.SourceAgent, Cmd: "flood"})
	got, st, err := l.ReadWithStats("sb", audit.Query{Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Host != "evidence.test" || got[1].Kind != audit.KindProcessStart {
		t.Fatalf("the log does not start with the early block and the process: %+v %+v", got[0], got[1])
	}
	blocked, allowed, other := counts(got)
	// The budgets: a burst, then the rate over the time the flood took.
	most := int64(burst + rate*elapsed.Seconds() + 1)
	if blocked-1 > most || allowed > most || blocked < burst || allowed < burst {
		t.Errorf("recorded %d blocked and %d allowed lookups in %v, want %d to %d of each", blocked-1, allowed, elapsed, burst, most)
	}
	if other != 2 {
		t.Errorf("%d process entries, want 2 (they are not bounded)", other)
	}
	if blocked-1+st.Dropped.Blocked != flood || allowed+st.Dropped.Allowed != flood {
		t.Errorf("recorded %d+%d blocked, %d+%d allowed: not every decision is accounted for (%d each)",
			blocked-1, st.Dropped.Blocked, allowed, st.Dropped.Allowed, flood)
	}
	var summary *audit.Entry
	for i, e := range got {
		if e.Rule == audit.RuleNotRecorded && e.Decision == audit.DecisionBlocked {
			summary = &got[i]
		}
	}
	if summary == nil || summary.Kind != audit.KindDNS || summary.Source != audit.SourceDaemon ||
		!strings.Contains(summary.Reason, "were not recorded one by one") || !strings.Contains(summary.Reason, fmt.Sprintf("the last host=b%d.test", flood-1)) {
		t.Fatalf("summary of the blocked lookups: %+v", summary)
	}
	// A command's "blocked since I started?" sees the summary too.
	if b, _ := l.Read("sb", audit.Query{Since: early, Decision: audit.DecisionBlocked, Limit: 10000}); len(b) < 2 || b[len(b)-1].Rule != audit.RuleNotRecorded {
		t.Errorf("blocked since the start: %d entries, last %+v", len(b), b[len(b)-1])
	}
	// The stats of a read answered from memory are the file's.
	if none, st2, err := l.ReadWithStats("sb", audit.Query{Since: time.Now().Add(time.Minute), Decision: audit.DecisionBlocked}); err != nil || len(none) != 0 || st2 != st {
		t.Errorf("stats from memory %+v (%d entries, %v), from the file %+v", st2, len(none), err, st)
	}
	// Another sandbox's budget is its own.
	l.Append(audit.Entry{SandboxID: "other", Kind: audit.KindDNS, Source: audit.SourceProxy, Decision: audit.DecisionBlocked, Host: "x.test"})
	if o, _ := l.Read("other", audit.Query{}); len(o) != 1 || o[0].Host != "x.test" {
		t.Errorf("another sandbox: %+v", o)
	}
}

// TestCapDropsRoutineFirst: when a file outgrows its cap, allowed decisions
// go first; blocked ones and the rest go only when that is not enough, and
// then never the oldest ones. The notes count everything dropped.
func TestCapDropsRoutineFirst(t *testing.T) {
	const capBytes = 64 << 10
	l, _ := newLog(t, audit.Options{MaxFileBytes: capBytes, Rate: -1})
	appendN := func(n int, decision, prefix string) {
		for i := range n {
			l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindConnect, Source: audit.SourceProxy, Decision: decision, Host: fmt.Sprintf("%s%d.test", prefix, i)})
			if i%200 == 0 {
				l.Flush()
			}
		}
	}
	l.Append(audit.Entry{SandboxID: "sb", Kind: audit.KindConnect, Source: audit.SourceProxy, Decision: audit.DecisionBlocked, Host: "evidence.test"})
	appendN(3000, audit.DecisionAllowed, "routine")
	got, st, err := l.ReadWithStats("sb", audit.Query{Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	blocked, allowed, _ := counts(got)
	if got[0].Host != "evidence.test" || blocked != 1 {
		t.Fatalf("the early block was dropped before routine entries: first %+v, %d blocked", got[0], blocked)
	}
	if st.Dropped.Allowed == 0 || allowed+st.Dropped.Allowed != 3000 || st.Dropped.Blocked != 0 {
		t.Errorf("%d allowed kept, dropped %+v: want the 3000 accounted for, no block dropped", allowed, st.Dropped)
	}
	// Blocked decisions alone past the cap: the oldest stay.
	appendN(3000, audit.DecisionBlocked, "blocked")
	got, st, err = l.ReadWithStats("sb", audit.Query{Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	blocked, allowed, _ = counts(got)
	var hosts []string
	for _, e := range got {
		if e.Dropped == nil {
			hosts = append(hosts, e.Host)
		}
	}
	if hosts[0] != "evidence.test" || hosts[1] != "blocked0.test" || hosts[len(hosts)-1] != "blocked2999.test" {
		t.Errorf("the oldest or newest blocks were dropped: %q, %q ... %q", hosts[0], hosts[1], hosts[len(hosts)-1])
	}
	if blocked+st.Dropped.Blocked != 3001 || allowed+st.Dropped.Allowed != 3000 || st.Dropped.Blocked == 0 {
		t.Errorf("kept %d blocked %d allowed, dropped %+v: not every entry is accounted for", blocked, allowed, st.Dropped)
	}
	if allowed != 0 {
		t.Errorf("%d allowed entries kept while blocked ones were dropped", allowed)
	}
	if _, st2, _ := l.ReadWithStats("sb", audit.Query{Since: time.Now().Add(time.Minute), Decision: audit.DecisionBlocked}); st2 != st {
		t.Errorf("stats from memory %+v, from the file %+v", st2, st)
	}
}
