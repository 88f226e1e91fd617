package audit

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// budget is one sandbox's bound on proxy decisions: a token bucket for
// blocked decisions and one for the others, and what each held back.
type budget struct {
	tokens [2]float64
	at     time.Time // when tokens were last refilled
	held   map[heldKey]*heldBack
}

type heldKey struct{ kind, decision string }

// heldBack is what a budget did not record one by one: how many, and the
// first and last of them.
type heldBack struct {
	n           int64
	first, last Entry
}

func class(e Entry) int {
	if e.Decision == DecisionBlocked {
		return 0
	}
	return 1
}

// admit takes a token for e from its sandbox's budget, or counts e among
// those held back. Called with l.mu held.
func (l *Log) admit(e Entry) bool {
	if l.rate <= 0 {
		return true
	}
	now := time.Now()
	b := l.budgets[e.SandboxID]
	if b == nil {
		b = &budget{tokens: [2]float64{l.burst, l.burst}, at: now}
		l.budgets[e.SandboxID] = b
	}
	refill := now.Sub(b.at).Seconds() * l.rate
	b.at = now
	for i := range b.tokens {
		b.tokens[i] = min(b.tokens[i]+refill, l.burst)
	}
	c := class(e)
	if b.tokens[c] >= 1 {
		b.tokens[c]--
		return true
	}
	if b.held == nil {
		b.held = map[heldKey]*heldBack{}
	}
	k := heldKey{e.Kind, e.Decision}
	h := b.held[k]
	if h == nil {
		h = &heldBack{first: e}
		b.held[k] = h
	}
	h.n++
	h.last = e
	return false
}

// holding says whether any decisions wait to be summed up.
func (l *Log) holding() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range l.budgets {
		if len(b.held) > 0 {
			return true
		}
	}
	return false
}

// summarizeHeld queues, for every sandbox that had decisions held back, one
// entry per kind and decision that stands for them, and forgets budgets
// that are full again.
func (l *Log) summarizeHeld() {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	for id, b := range l.budgets {
		keys := make([]heldKey, 0, len(b.held))
		for k := range b.held {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b heldKey) int {
			return strings.Compare(a.kind+" "+a.decision, b.kind+" "+b.decision)
		})
		for _, k := range keys {
			h := b.held[k]
			e := Entry{Time: now, SandboxID: id, Kind: k.kind, Source: SourceDaemon, Decision: k.decision, Rule: RuleNotRecorded,
				Host: h.first.Host, Dst: h.first.Dst, Dropped: &Dropped{},
				Reason: fmt.Sprintf("%d more %s %s decisions, from %s to %s, were not recorded one by one: past a burst of %d the audit log records %d a second per sandbox; the first was %s, the last %s",
					h.n, decisionWord(k.decision), k.kind, h.first.Time.UTC().Format(time.RFC3339Nano), h.last.Time.UTC().Format(time.RFC3339Nano),
					int(l.burst), int(l.rate), describe(h.first), describe(h.last))}
			if k.decision == DecisionBlocked {
				e.Dropped.Blocked = h.n
				if e.Time.After(l.lastBlocked[id]) {
					l.lastBlocked[id] = e.Time
				}
			} else {
				e.Dropped.Allowed = h.n
			}
			l.noteDroppedLocked(id, *e.Dropped)
			l.pending = append(l.pending, e)
		}
		b.held = nil
		if now.Sub(b.at).Seconds()*l.rate >= l.burst {
			delete(l.budgets, id)
		}
	}
}

func decisionWord(d string) string {
	if d == "" {
		return "undecided"
	}
	return d
}

// describe names what an entry was about, for a summary.
func describe(e Entry) string {
	parts := []string{}
	for _, kv := range [][2]string{{"host", e.Host}, {"dst", e.Dst}, {"rule", e.Rule}} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+"="+kv[1])
		}
	}
	if len(parts) == 0 {
		return "(nothing named)"
	}
	return strings.Join(parts, " ")
}
