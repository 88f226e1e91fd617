package agent

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
)

// auditKeep bounds the events held for a daemon that is not following
// (restarting): older ones are dropped and the gap shows in the sequence.
const auditKeep = 4096

// auditFeed holds the newest events and wakes followers.
type auditFeed struct {
	mu     sync.Mutex
	events []agentapi.AuditEvent // oldest first, at most auditKeep
	next   uint64                // Seq of the next event
	wake   chan struct{}
}

func (f *auditFeed) emit(e agentapi.AuditEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.wake == nil {
		f.wake = make(chan struct{})
	}
	f.next++
	e.Seq = f.next
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	if len(f.events) == auditKeep {
		// Sliced, not shifted: append reallocates once the slack is used
		// up, so dropping the oldest costs O(1) amortized, not a 4096-event
		// copy under the lock on every command start and exit.
		f.events = f.events[1:]
	}
	f.events = append(f.events, e)
	close(f.wake)
	f.wake = make(chan struct{})
}

// forget drops the events held; the sequence goes on, so a follower sees
// only what comes after.
func (f *auditFeed) forget() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = nil
}

// since returns the events after seq and a channel closed by the next emit.
func (f *auditFeed) since(seq uint64) ([]agentapi.AuditEvent, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.wake == nil {
		f.wake = make(chan struct{})
	}
	// Sequence numbers are contiguous: the first event after seq is found
	// by arithmetic, not by a scan.
	if len(f.events) == 0 || seq >= f.events[len(f.events)-1].Seq {
		return nil, f.wake
	}
	i := 0
	if first := f.events[0].Seq; seq >= first {
		i = int(seq - first + 1)
	}
	return slices.Clone(f.events[i:]), f.wake
}

// auditKeepalive keeps an idle follow stream visibly alive.
const auditKeepalive = 15 * time.Second

// handleEvents streams audit events after ?after=SEQ as NDJSON until the
// client goes away; {"kind":"keepalive"} lines fill idle periods.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	after, _ := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	tick := time.NewTicker(auditKeepalive)
	defer tick.Stop()
	for {
		evs, wake := s.audit.since(after)
		for _, e := range evs {
			if err := enc.Encode(e); err != nil {
				return
			}
			after = e.Seq
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-wake:
		case <-tick.C:
			if err := enc.Encode(agentapi.AuditEvent{Kind: agentapi.KindKeepalive, Seq: after}); err != nil {
				return
			}
		case <-r.Context().Done():
			return
		case <-s.done:
			return
		}
	}
}

// auditCmd renders argv for the log: the command and its arguments, quoted
// where a space would make it ambiguous.
func auditCmd(argv []string) string {
	parts := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n\"'") {
			a = strconv.Quote(a)
		}
		parts[i] = a
	}
	return strings.Join(parts, " ")
}
