package agent

import (
	"bytes"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/envd/process"
)

// Per-process logs: every process started through process.Start keeps the
// last procLogMax bytes of its output (stdout, stderr or pty) as timestamped
// lines, readable while it runs and after it ended
// (GET /cella/processes/{pid}/logs), and matched by log waits
// (GET /cella/wait?log=...).
const (
	// procLogMax bounds the retained output of one process.
	procLogMax = 1 << 20
	// procLogMaxLine flushes a line that never ends (progress bars).
	procLogMaxLine = 64 << 10
	// procLogKeepEnded is how many ended processes keep their logs.
	procLogKeepEnded = 64
)

// logLine is one line of output (without its newline).
type logLine struct {
	seq    uint64
	ts     time.Time
	stream string // stdout, stderr or pty
	text   string
}

// procLog is the bounded line log of one process.
type procLog struct {
	pid     int
	cmd     string
	started time.Time

	mu      sync.Mutex
	lines   []logLine
	size    int
	nextSeq uint64
	dropped int64 // bytes dropped from the front
	pending [3][]byte
	pendTS  [3]time.Time
	changed chan struct{} // closed and replaced on every change
	end     *process.ProcessEvent_EndEvent
	ended   time.Time
}

func newProcLog(pid int, cmd string) *procLog {
	return &procLog{pid: pid, cmd: cmd, started: time.Now(), changed: make(chan struct{})}
}

var streamNames = [3]string{"stdout", "stderr", "pty"}

func (l *procLog) notifyLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// write records output of kind (outStdout, outStderr, outPty).
func (l *procLog) write(kind int, data []byte) {
	if l == nil || len(data) == 0 || kind < 0 || kind > 2 {
		return
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pending[kind]) == 0 {
		l.pendTS[kind] = now
	}
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			l.pending[kind] = append(l.pending[kind], data...)
			if len(l.pending[kind]) >= procLogMaxLine {
				l.flushLocked(kind)
			}
			break
		}
		l.pending[kind] = append(l.pending[kind], data[:i]...)
		l.flushLocked(kind)
		data = data[i+1:]
		l.pendTS[kind] = now
	}
	l.notifyLocked()
}

func (l *procLog) flushLocked(kind int) {
	text := strings.TrimSuffix(string(l.pending[kind]), "\r")
	l.pending[kind] = l.pending[kind][:0]
	l.lines = append(l.lines, logLine{seq: l.nextSeq, ts: l.pendTS[kind], stream: streamNames[kind], text: text})
	l.nextSeq++
	l.size += len(text) + 1
	for l.size > procLogMax && len(l.lines) > 1 {
		l.size -= len(l.lines[0].text) + 1
		l.dropped += int64(len(l.lines[0].text) + 1)
		l.lines = l.lines[1:]
	}
}

// finish records the end of the process; the partial last lines become lines.
func (l *procLog) finish(end *process.ProcessEvent_EndEvent) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.pending {
		if len(l.pending[k]) > 0 {
			l.flushLocked(k)
		}
	}
	l.end = end
	l.ended = time.Now()
	l.notifyLocked()
}

// snapshot returns the lines with seq >= from, the partial lines, whether
// the process ended, and the channel closed on the next change.
func (l *procLog) snapshot(from uint64) (lines []logLine, partial []logLine, end *process.ProcessEvent_EndEvent, changed <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ln := range l.lines {
		if ln.seq >= from {
			lines = append(lines, ln)
		}
	}
	for k, p := range l.pending {
		if len(p) > 0 {
			partial = append(partial, logLine{seq: l.nextSeq, ts: l.pendTS[k], stream: streamNames[k], text: string(p)})
		}
	}
	return lines, partial, l.end, l.changed
}

// logStore holds the logs of running processes and of the last ended ones.
type logStore struct {
	mu    sync.Mutex
	byPid map[int]*procLog
}

// attach gives p a log; called once its pid is known, before any output.
func (st *logStore) attach(p *proc) {
	l := newProcLog(p.pid, p.config.GetCmd()+" "+strings.Join(p.config.GetArgs(), " "))
	p.log = l
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.byPid == nil {
		st.byPid = map[int]*procLog{}
	}
	st.byPid[p.pid] = l
	// Keep only the procLogKeepEnded most recently ended logs.
	var ended []*procLog
	for _, x := range st.byPid {
		x.mu.Lock()
		if x.end != nil {
			ended = append(ended, x)
		}
		x.mu.Unlock()
	}
	if len(ended) > procLogKeepEnded {
		sort.Slice(ended, func(i, j int) bool { return ended[i].ended.Before(ended[j].ended) })
		for _, x := range ended[:len(ended)-procLogKeepEnded] {
			delete(st.byPid, x.pid)
		}
	}
}

func (st *logStore) get(pid int) *procLog {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.byPid[pid]
}

// registerCellaExtras adds the log and wait endpoints to the agent's mux.
func (s *Server) registerCellaExtras(mux *http.ServeMux) {
	mux.HandleFunc("GET "+agentapi.ProcessLogsPattern, s.handleProcLogs)
	mux.HandleFunc("GET "+agentapi.WaitPath, s.handleWait)
}

func (s *Server) handleProcLogs(w http.ResponseWriter, r *http.Request) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		jsonError(w, http.StatusBadRequest, fmt.Errorf("invalid pid %q", r.PathValue("pid")))
		return
	}
	l := s.logs.get(pid)
	if l == nil {
		jsonError(w, http.StatusNotFound, fmt.Errorf("no logs for process %d: it was not started through the process API, or it ended long ago (the last %d ended processes keep their logs)", pid, procLogKeepEnded))
		return
	}
	lines, partial, end, _ := l.snapshot(0)
	stream := r.URL.Query().Get("stream") // "", stdout, stderr, pty
	if r.URL.Query().Get("format") == "text" || strings.Contains(r.Header.Get("Accept"), "text/plain") {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		var b strings.Builder
		for _, ln := range append(lines, partial...) {
			if stream != "" && ln.stream != stream {
				continue
			}
			b.WriteString(ln.text)
			b.WriteByte('\n')
		}
		_, _ = w.Write([]byte(b.String()))
		return
	}
	l.mu.Lock()
	out := agentapi.ProcessLogs{PID: pid, Cmd: l.cmd, Running: end == nil, StartedAt: l.started, DroppedBytes: l.dropped, MaxBytes: procLogMax, Lines: []agentapi.LogEntry{}}
	if end != nil {
		code := end.ExitCode
		out.ExitCode, out.Status = &code, end.Status
		t := l.ended
		out.EndedAt = &t
	}
	l.mu.Unlock()
	for _, ln := range lines {
		if stream == "" || ln.stream == stream {
			out.Lines = append(out.Lines, agentapi.LogEntry{Time: ln.ts, Stream: ln.stream, Line: ln.text})
		}
	}
	for _, ln := range partial {
		if stream == "" || ln.stream == stream {
			out.Lines = append(out.Lines, agentapi.LogEntry{Time: ln.ts, Stream: ln.stream, Line: ln.text, Partial: true})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

const maxWait = 1 * time.Hour

// handleWait blocks until a port listens (?port=N) or a process prints a
// line matching a regular expression (?log=RE&pid=P), for at most ?timeout=
// (a Go duration or seconds; default 30s).
func (s *Server) handleWait(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	timeout := 30 * time.Second
	if v := q.Get("timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			secs, err2 := strconv.ParseFloat(v, 64)
			if err2 != nil {
				jsonError(w, http.StatusBadRequest, fmt.Errorf("invalid timeout %q: use a duration like 30s", v))
				return
			}
			d = time.Duration(secs * float64(time.Second))
		}
		if d <= 0 || d > maxWait {
			jsonError(w, http.StatusBadRequest, fmt.Errorf("timeout %v must be positive and at most %v", d, maxWait))
			return
		}
		timeout = d
	}
	start := time.Now()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	ctx := r.Context()

	switch {
	case q.Get("port") != "":
		port, err := strconv.Atoi(q.Get("port"))
		if err != nil || port <= 0 || port > 65535 {
			jsonError(w, http.StatusBadRequest, fmt.Errorf("invalid port %q", q.Get("port")))
			return
		}
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if portListening(port) {
				writeJSON(w, http.StatusOK, agentapi.WaitResult{Ready: true, Port: port, ElapsedMs: time.Since(start).Milliseconds()})
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-deadline.C:
				writeJSON(w, http.StatusRequestTimeout, agentapi.WaitResult{Port: port, ElapsedMs: time.Since(start).Milliseconds(), Code: http.StatusRequestTimeout,
					Message: fmt.Sprintf("timeout: nothing listened on port %d within %v", port, timeout)})
				return
			case <-tick.C:
			}
		}
	case q.Get("log") != "":
		re, err := regexp.Compile(q.Get("log"))
		if err != nil {
			jsonError(w, http.StatusBadRequest, fmt.Errorf("invalid log regexp: %w", err))
			return
		}
		pid, err := strconv.Atoi(q.Get("pid"))
		if err != nil || pid <= 0 {
			jsonError(w, http.StatusBadRequest, fmt.Errorf("a log wait needs the pid of the process to watch (pid=%q)", q.Get("pid")))
			return
		}
		l := s.logs.get(pid)
		if l == nil {
			jsonError(w, http.StatusNotFound, fmt.Errorf("process %d not found (only processes started through the process API are watched)", pid))
			return
		}
		var from uint64
		for {
			lines, partial, end, changed := l.snapshot(from)
			for _, ln := range append(lines, partial...) {
				if re.MatchString(ln.text) {
					writeJSON(w, http.StatusOK, agentapi.WaitResult{Ready: true, PID: pid, Line: ln.text, ElapsedMs: time.Since(start).Milliseconds()})
					return
				}
			}
			if len(lines) > 0 {
				from = lines[len(lines)-1].seq + 1
			}
			if end != nil {
				writeJSON(w, http.StatusConflict, agentapi.WaitResult{PID: pid, ElapsedMs: time.Since(start).Milliseconds(), Code: http.StatusConflict,
					Message: fmt.Sprintf("process %d ended (%s) without printing a line matching %q", pid, end.Status, re.String())})
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-deadline.C:
				writeJSON(w, http.StatusRequestTimeout, agentapi.WaitResult{PID: pid, ElapsedMs: time.Since(start).Milliseconds(), Code: http.StatusRequestTimeout,
					Message: fmt.Sprintf("timeout: process %d printed no line matching %q within %v", pid, re.String(), timeout)})
				return
			case <-changed:
			}
		}
	default:
		jsonError(w, http.StatusBadRequest, fmt.Errorf("wait for what? pass port=N, or log=REGEXP and pid=P"))
	}
}
