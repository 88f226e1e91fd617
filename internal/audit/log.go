// Package audit keeps a per-sandbox record of what a sandbox did and what
// was decided about it: outbound connections and DNS lookups (the egress
// proxy), processes (the agent), file writes and lifecycle events (the
// daemon).
//
// Each sandbox has one JSON Lines file, <dir>/<sandbox-id>.jsonl, one Entry
// per line, oldest first. Append never blocks its caller on the disk: it
// queues the entry and one writer goroutine appends queued entries to their
// files, gathering what comes within 20 ms into one append per file (well
// under 100 ms; Read and Close first wait for the queue to drain).
//
// Bounds, so that a sandbox flooding its own log can neither fill the disk
// nor push the evidence of what it did out of it:
//
//   - Rate: the proxy's decisions are recorded one by one up to a burst
//     (Options.Burst, 1000) and then at Options.Rate (100) a second per
//     sandbox, blocked and allowed decisions each on their own budget (a
//     flood of allowed lookups cannot silence blocks). What goes past it is
//     counted and summed up in one entry per kind and decision a second
//     (rule "not-recorded", with the first and last of them).
//   - Size: a file that grows past MaxFileBytes (default 16 MiB) is cut to
//     half in place, rather than rotated to a .1 file, so a reader always
//     has one file and the disk use per sandbox stays under the cap. The
//     cut drops routine entries (allowed decisions) first, oldest first;
//     only if that is not enough does it drop others (blocked decisions,
//     processes, files, lifecycle), oldest first but never the oldest
//     eighth of the cap, where the story of the sandbox starts.
//   - Queue: if the writer falls behind by more than 65536 entries,
//     further entries are dropped.
//
// Each of these writes a note whose Dropped counts what it dropped, by
// blocked, allowed and other: Stats sums them. Entries are written but
// not fsynced: a host crash may lose the last moments of a log, never
// corrupt earlier lines (a torn last line is skipped on read).
package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/cella-sandbox/cella/internal/errdefs"
)

// DefaultMaxFileBytes is the per-sandbox file cap when Options leave it 0.
const DefaultMaxFileBytes = 16 << 20

// DefaultLimit is how many entries Read returns when Query.Limit is 0.
const DefaultLimit = 1000

// maxPending bounds the queue between Append and the writer: a stuck disk
// must not grow the daemon's memory without limit.
const maxPending = 1 << 16

// maxFieldBytes bounds each string field, so one command line or message
// cannot take a large share of a file's cap.
const maxFieldBytes = 4096

// Defaults of Options.Rate and Options.Burst.
const (
	DefaultRate  = 100
	DefaultBurst = 1000
)

// RuleNotRecorded is the Rule of an entry that stands for decisions the
// rate bound did not record one by one.
const RuleNotRecorded = "not-recorded"

var idRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// validID keeps a sandbox ID usable as a file name inside the log dir.
func validID(id string) bool { return idRe.MatchString(id) && id != "." && id != ".." }

// Options tune a Log.
type Options struct {
	// Redact is applied to every free-text field (all string fields but
	// SandboxID, Kind, Source and Decision) before an entry is written:
	// the secrets manager's Redact, so secret values never reach disk.
	Redact func(string) string
	// MaxFileBytes caps each sandbox's file (0: DefaultMaxFileBytes).
	MaxFileBytes int64
	// Log receives the writer's own failures (nil: slog.Default()).
	Log *slog.Logger
	// Rate and Burst bound how many proxy decisions are recorded one by
	// one per sandbox (see the package doc; 0: DefaultRate and
	// DefaultBurst; Rate < 0: no bound).
	Rate, Burst int
}

// Query selects entries for Read. Zero fields select everything.
type Query struct {
	Since    time.Time // entries at or after
	Until    time.Time // entries at or before
	Kind     []string  // any of these kinds
	Decision string    // only this decision
	Limit    int       // the newest Limit matches (0: DefaultLimit)
}

// Log is the audit log of every sandbox of one daemon.
type Log struct {
	dir     string
	redact  func(string) string
	maxFile int64
	log     *slog.Logger

	// fileMu is held by whoever changes files: the writer for a whole
	// batch (taking it from the queue included), and Remove. So Remove
	// sees every queued entry of its sandbox and none is written after it.
	fileMu sync.Mutex

	mu      sync.Mutex
	pending []Entry
	dropped map[string]*Dropped // per sandbox: entries refused since the last batch
	closed  bool
	// rate is the per-sandbox bound on proxy decisions (rate.go).
	rate, burst float64
	budgets     map[string]*budget
	// lastBlocked is the newest blocked entry this process accepted per
	// sandbox; complete marks the sandboxes whose whole file this process
	// wrote (it did not exist at the first write), for which lastBlocked
	// is the truth: asking them for blocks after it needs no file read,
	// which is what every exec's "anything blocked?" question asks.
	lastBlocked map[string]time.Time
	complete    map[string]bool
	// droppedTotal is what this process dropped per sandbox: the file's
	// Stats for the complete ones.
	droppedTotal map[string]Dropped
	written      map[string]bool // guarded by fileMu: sandboxes written to since start

	invalid atomic.Int64 // entries with an unusable sandbox ID

	wake      chan struct{}
	flush     chan chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// New opens the audit log kept in dir (created if missing) and starts its
// writer.
func New(dir string, o Options) (*Log, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create audit log dir: %w", err)
	}
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = DefaultMaxFileBytes
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Redact == nil {
		o.Redact = func(s string) string { return s }
	}
	switch {
	case o.Rate == 0:
		o.Rate = DefaultRate
	case o.Rate < 0:
		o.Rate = 0
	}
	if o.Burst <= 0 {
		o.Burst = DefaultBurst
	}
	l := &Log{
		dir: dir, redact: o.Redact, maxFile: o.MaxFileBytes, log: o.Log,
		rate: float64(o.Rate), burst: float64(o.Burst), budgets: map[string]*budget{},
		dropped:     map[string]*Dropped{},
		lastBlocked: map[string]time.Time{}, complete: map[string]bool{}, written: map[string]bool{},
		droppedTotal: map[string]Dropped{},
		wake:         make(chan struct{}, 1),
		flush:        make(chan chan struct{}),
		stop:         make(chan struct{}),
		done:         make(chan struct{}),
	}
	go l.run()
	return l, nil
}

func (l *Log) path(id string) string { return filepath.Join(l.dir, id+".jsonl") }

// Append queues an entry; it never waits for the disk. A zero Time is set
// to now. Entries after Close, or with a SandboxID that cannot name a file,
// are dropped.
func (l *Log) Append(e Entry) {
	if !validID(e.SandboxID) {
		l.invalid.Add(1)
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	l.mu.Lock()
	switch {
	case l.closed:
		l.mu.Unlock()
		return
	case e.Source == SourceProxy && !l.admit(e):
		// Held back, to be summed up: a reader asking for blocks since
		// before it must read (and so flush) the file.
		if e.Decision == DecisionBlocked && e.Time.After(l.lastBlocked[e.SandboxID]) {
			l.lastBlocked[e.SandboxID] = e.Time
		}
		l.mu.Unlock()
		l.wakeWriter()
		return
	case len(l.pending) >= maxPending:
		d := l.dropped[e.SandboxID]
		if d == nil {
			d = &Dropped{}
			l.dropped[e.SandboxID] = d
		}
		d.count(e)
		l.mu.Unlock()
		return
	}
	l.pending = append(l.pending, e)
	if e.Decision == DecisionBlocked && e.Time.After(l.lastBlocked[e.SandboxID]) {
		l.lastBlocked[e.SandboxID] = e.Time
	}
	l.mu.Unlock()
	l.wakeWriter()
}

func (l *Log) wakeWriter() {
	select {
	case l.wake <- struct{}{}:
	default: // a wake-up is already due
	}
}

// Flush waits until every entry appended before it is in its file.
func (l *Log) Flush() {
	ack := make(chan struct{})
	select {
	case l.flush <- ack:
		<-ack
	case <-l.done:
	}
}

// Close writes what is queued and stops the writer. Later Appends are
// dropped; Read and Remove keep working.
func (l *Log) Close() error {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		close(l.stop)
		<-l.done
	})
	return nil
}

func (l *Log) run() {
	defer close(l.done)
	// held fires once a second while decisions are held back, to sum
	// them up.
	var held <-chan time.Time
	for {
		select {
		case <-l.wake:
			if stopped := l.gather(); stopped {
				return
			}
		case <-held:
			held = nil
			l.summarizeHeld()
		case ack := <-l.flush:
			l.writeAll()
			close(ack)
		case <-l.stop:
			l.writeAll()
			return
		}
		l.drain()
		if held == nil && l.holding() {
			held = time.After(time.Second)
		}
	}
}

// gatherDelay is how long the writer lets entries gather after the first
// one woke it: an exec's start and exit, or a burst of connections, then
// cost one append to their sandbox's file instead of one each (an open,
// write, stat and close: 8 % of the daemon's CPU per exec, profiled). Read,
// Flush and Close do not wait for it.
const gatherDelay = 20 * time.Millisecond

// gather waits gatherDelay, or less when a Flush or Close asks for the
// queue; it reports whether Close did (the queue is written then).
func (l *Log) gather() (stopped bool) {
	t := time.NewTimer(gatherDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case ack := <-l.flush:
		l.writeAll()
		close(ack)
	case <-l.stop:
		l.writeAll()
		return true
	}
	return false
}

// writeAll sums up what is held back and writes everything queued: what
// a Flush or Close waits for.
func (l *Log) writeAll() {
	l.summarizeHeld()
	l.drain()
}

// drain writes batches until the queue is empty.
func (l *Log) drain() {
	for l.writeBatch() {
	}
}

// writeBatch writes what is queued now; false when there was nothing.
func (l *Log) writeBatch() bool {
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	l.mu.Lock()
	batch, dropped := l.pending, l.dropped
	l.pending, l.dropped = nil, map[string]*Dropped{}
	l.mu.Unlock()
	if len(batch) == 0 && len(dropped) == 0 {
		return false
	}
	var order []string
	bufs := map[string]*bytes.Buffer{}
	buf := func(id string) *bytes.Buffer {
		b, ok := bufs[id]
		if !ok {
			b = &bytes.Buffer{}
			bufs[id] = b
			order = append(order, id)
		}
		return b
	}
	for _, e := range batch {
		l.encode(buf(e.SandboxID), e)
	}
	for id, d := range dropped {
		l.noteDropped(id, *d)
		l.encode(buf(id), Entry{Time: time.Now(), SandboxID: id, Kind: KindLifecycle, Source: SourceDaemon, Dropped: d,
			Message: fmt.Sprintf("audit log dropped %d entries (%s): its writer fell behind", d.Total(), d)})
	}
	for _, id := range order {
		if err := l.appendFile(id, bufs[id].Bytes()); err != nil {
			l.log.Error("audit log write failed", "sandbox", id, "err", err)
		}
	}
	return true
}

func (l *Log) encode(b *bytes.Buffer, e Entry) {
	e.Time = e.Time.UTC()
	e.Observed = ObservedBy(e.Source) // never a writer's claim
	for _, f := range []*string{&e.Proto, &e.Dst, &e.Host, &e.Upstream, &e.Rule, &e.Reason, &e.Cmd, &e.User, &e.Cwd, &e.Status, &e.Path, &e.Error, &e.Message} {
		*f = truncate(l.redact(*f))
	}
	line, err := json.Marshal(e)
	if err != nil {
		// Entry has no field json cannot encode; keep the writer going.
		l.log.Error("audit entry not encodable", "sandbox", e.SandboxID, "err", err)
		return
	}
	b.Write(line)
	b.WriteByte('\n')
}

// truncate cuts s to maxFieldBytes on a rune boundary. It runs after
// redaction, so a cut never leaves part of a secret value behind.
func truncate(s string) string {
	if len(s) <= maxFieldBytes {
		return s
	}
	const mark = "…[truncated]"
	cut := maxFieldBytes - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

func (l *Log) appendFile(id string, data []byte) error {
	p := l.path(id)
	if !l.written[id] {
		l.written[id] = true
		_, err := os.Stat(p)
		l.mu.Lock()
		l.complete[id] = errors.Is(err, os.ErrNotExist)
		l.mu.Unlock()
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open %s: %w", p, err)
	}
	_, werr := f.Write(data)
	fi, serr := f.Stat()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return fmt.Errorf("append to %s: %w", p, err)
	}
	if fi.Size() <= l.maxFile {
		return nil
	}
	return l.compact(id)
}

// compact cuts a file that outgrew the cap to half of it, dropping
// routine entries first (see the package doc), and notes the cut, with its
// counts, at its end. The new content replaces the file by rename, so a
// concurrent Read sees the old file or the new one.
func (l *Log) compact(id string) error {
	p := l.path(id)
	data, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("compact %s: %w", p, err)
	}
	kept, dropped := cut(data, l.maxFile/2, l.maxFile/8)
	l.noteDropped(id, dropped.fresh)
	var b bytes.Buffer
	for _, ln := range kept {
		b.Write(ln)
	}
	l.encode(&b, Entry{Time: time.Now(), SandboxID: id, Kind: KindLifecycle, Source: SourceDaemon, Dropped: &dropped.counts,
		Message: fmt.Sprintf("audit log reached its %d-byte cap: %d entries (%d bytes) were dropped, routine ones (allowed decisions) first and oldest first, %s",
			l.maxFile, dropped.lines, dropped.bytes, dropped.counts)})
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o600); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("compact %s: %w", p, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("compact %s: %w", p, err)
	}
	return nil
}

// cutStats is what cut dropped: the entries by class, counting those the
// notes dropped stood for, so the file's notes still sum to everything.
type cutStats struct {
	lines, bytes int
	counts       Dropped
	fresh        Dropped // of counts, the entries that were no notes
}

// cut returns the lines of data to keep so that they take at most target
// bytes: it drops allowed decisions oldest first, then, if that is not
// enough, other lines oldest first, sparing the first head bytes of those.
func cut(data []byte, target, head int64) ([][]byte, cutStats) {
	type line struct {
		b       []byte
		e       Entry
		routine bool
		drop    bool
	}
	var lines []line
	size := int64(0)
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break // a torn last line is not an entry
		}
		ln := line{b: data[:i+1]}
		data = data[i+1:]
		if json.Unmarshal(ln.b, &ln.e) != nil {
			ln.drop = true // not an entry either
		}
		ln.routine = ln.e.Decision == DecisionAllowed
		lines = append(lines, ln)
		if !ln.drop {
			size += int64(len(ln.b))
		}
	}
	for pass := range 2 {
		spared := int64(0)
		for i := range lines {
			if size <= target {
				break
			}
			ln := &lines[i]
			if ln.drop || ln.routine != (pass == 0) {
				continue
			}
			if pass == 1 && spared+int64(len(ln.b)) <= head {
				spared += int64(len(ln.b))
				continue
			}
			ln.drop = true
			size -= int64(len(ln.b))
		}
	}
	var kept [][]byte
	var st cutStats
	for _, ln := range lines {
		if !ln.drop {
			kept = append(kept, ln.b)
			continue
		}
		st.lines++
		st.bytes += len(ln.b)
		if ln.e.Dropped != nil {
			st.counts.Add(*ln.e.Dropped) // a note: what it stood for
		} else if ln.e.Kind != "" {
			st.counts.count(ln.e)
			st.fresh.count(ln.e)
		}
	}
	return kept, st
}

// noteDropped adds to what this process dropped of a sandbox's entries.
func (l *Log) noteDropped(id string, d Dropped) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.noteDroppedLocked(id, d)
}

func (l *Log) noteDroppedLocked(id string, d Dropped) {
	t := l.droppedTotal[id]
	t.Add(d)
	l.droppedTotal[id] = t
}

// Exists reports whether a sandbox has a log file (after writing what is
// queued).
func (l *Log) Exists(sandboxID string) bool {
	if !validID(sandboxID) {
		return false
	}
	l.Flush()
	_, err := os.Stat(l.path(sandboxID))
	return err == nil
}

// Stats is what a read learns besides the entries.
type Stats struct {
	// Dropped sums the notes of the whole file: every entry the log did
	// not keep, by class.
	Dropped Dropped `json:"dropped"`
}

// Read returns a sandbox's entries that match q, oldest first: the newest
// q.Limit of them. A sandbox without a file has no entries.
func (l *Log) Read(sandboxID string, q Query) ([]Entry, error) {
	return l.read(sandboxID, q, nil)
}

// ReadWithStats is Read, and the stats of the whole file.
func (l *Log) ReadWithStats(sandboxID string, q Query) ([]Entry, Stats, error) {
	var st Stats
	out, err := l.read(sandboxID, q, &st)
	return out, st, err
}

func (l *Log) read(sandboxID string, q Query, st *Stats) ([]Entry, error) {
	limit := q.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	out := []Entry{}
	if q.Decision == DecisionBlocked && !q.Since.IsZero() {
		l.mu.Lock()
		none := l.complete[sandboxID] && q.Since.After(l.lastBlocked[sandboxID])
		if none && st != nil {
			st.Dropped = l.droppedTotal[sandboxID]
		}
		l.mu.Unlock()
		if none {
			return out, nil
		}
	}
	err := l.scan(sandboxID, func(e Entry) {
		if st != nil && e.Dropped != nil {
			st.Dropped.Add(*e.Dropped)
		}
		if !q.match(e) {
			return
		}
		out = append(out, e)
		// Keep the newest matches without holding every one.
		if len(out)/2 >= limit {
			out = append(out[:0], out[len(out)-limit:]...)
		}
	})
	if err != nil {
		return nil, err
	}
	if len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, nil
}

// LastSeq returns the highest Seq among a sandbox's entries from source (0
// when there are none), so a follower of a numbered feed that restarts can
// skip what is already kept. It reads the whole file: call it once per
// follow, not per entry.
func (l *Log) LastSeq(sandboxID, source string) (uint64, error) {
	var last uint64
	err := l.scan(sandboxID, func(e Entry) {
		if e.Source == source && e.Seq > last {
			last = e.Seq
		}
	})
	return last, err
}

// scan calls f with each entry of a sandbox's file, oldest first, after
// writing what is queued.
func (l *Log) scan(sandboxID string, f func(Entry)) error {
	if !validID(sandboxID) {
		return errdefs.InvalidArgument("invalid sandbox ID %q", sandboxID)
	}
	l.Flush()
	file, err := os.Open(l.path(sandboxID))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read audit log of %s: %w", sandboxID, err)
	}
	defer file.Close()
	r := bufio.NewReaderSize(file, 64<<10)
	for {
		line, err := r.ReadBytes('\n')
		if err == io.EOF {
			// A line without its newline is being written, or was torn by
			// a crash: it is not an entry (yet).
			return nil
		}
		if err != nil {
			return fmt.Errorf("read audit log of %s: %w", sandboxID, err)
		}
		var e Entry
		if json.Unmarshal(line, &e) == nil {
			e.Observed = ObservedBy(e.Source) // lines written before the field
			f(e)
		}
	}
}

func (q Query) match(e Entry) bool {
	switch {
	case !q.Since.IsZero() && e.Time.Before(q.Since):
		return false
	case !q.Until.IsZero() && e.Time.After(q.Until):
		return false
	case q.Decision != "" && e.Decision != q.Decision:
		return false
	case len(q.Kind) > 0 && !slices.Contains(q.Kind, e.Kind):
		return false
	}
	return true
}

// Remove deletes a sandbox's log, entries still queued included.
func (l *Log) Remove(sandboxID string) error {
	if !validID(sandboxID) {
		return errdefs.InvalidArgument("invalid sandbox ID %q", sandboxID)
	}
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	l.mu.Lock()
	l.pending = slices.DeleteFunc(l.pending, func(e Entry) bool { return e.SandboxID == sandboxID })
	delete(l.dropped, sandboxID)
	delete(l.budgets, sandboxID)
	delete(l.droppedTotal, sandboxID)
	delete(l.lastBlocked, sandboxID)
	delete(l.complete, sandboxID)
	l.mu.Unlock()
	delete(l.written, sandboxID)
	if err := os.Remove(l.path(sandboxID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove audit log of %s: %w", sandboxID, err)
	}
	return nil
}

// Invalid returns how many entries were dropped for an unusable SandboxID.
func (l *Log) Invalid() int64 { return l.invalid.Load() }
