package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/audit"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// maxLogLimit bounds one answer of the logs routes.
const maxLogLimit = 10000

func (s *Server) auditRoutes(auth func(http.HandlerFunc) http.Handler) {
	m := s.mux
	m.Handle("GET /sandboxes/{id}/logs", auth(s.sandboxLogsV1))
	m.Handle("GET /v2/sandboxes/{id}/logs", auth(s.sandboxLogsV2))
}

// sandboxLog is an item of E2B's v1 "logs": a line that is itself a JSON
// object, as E2B's are (the raw structured log line; the E2B CLI's
// `sandbox logs` parses it and reads level, logger and the rest).
type sandboxLog struct {
	Timestamp time.Time `json:"timestamp"`
	Line      string    `json:"line"`
}

// sandboxLogEntry is E2B's structured log item (v1 "logEntries", v2 "logs").
type sandboxLogEntry struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// sandboxLogsV1 is E2B's SandboxLogs plus cella's entries.
type sandboxLogsV1 struct {
	Logs       []sandboxLog      `json:"logs"`
	LogEntries []sandboxLogEntry `json:"logEntries"`
	Entries    []audit.Entry     `json:"entries"`
	// Dropped counts every entry the log did not keep (cella's field).
	Dropped audit.Dropped `json:"dropped"`
}

// sandboxLogsV2 is E2B's SandboxLogsV2Response (whose "logs" are the
// structured items, not lines) plus cella's entries.
type sandboxLogsV2 struct {
	Logs    []sandboxLogEntry `json:"logs"`
	Entries []audit.Entry     `json:"entries"`
	Dropped audit.Dropped     `json:"dropped"`
}

func logEntry(e audit.Entry) sandboxLogEntry {
	level := "info"
	if e.Blocked() {
		level = "warn"
	}
	return sandboxLogEntry{Timestamp: e.Time.UTC(), Level: level, Message: e.Line(), Fields: e.Fields()}
}

// logLine is the v1 line of an entry: a JSON object with E2B's keys (level,
// logger, message, sandboxID) and the entry's fields. The logger is the
// entry's kind, so that the CLI's --loggers filters by it.
func logLine(e audit.Entry, le sandboxLogEntry) string {
	line := make(map[string]string, len(le.Fields)+4)
	for k, v := range le.Fields {
		line[k] = v
	}
	delete(line, "sandboxId")
	line["level"], line["logger"], line["message"], line["sandboxID"] = le.Level, e.Kind, le.Message, e.SandboxID
	b, _ := json.Marshal(line) // a map of strings: no error
	return string(b)
}

// GET /sandboxes/{id}/logs?since=&kind=&decision=&limit= (E2B's start= too).
func (s *Server) sandboxLogsV1(w http.ResponseWriter, r *http.Request) {
	entries, st, ok := s.auditEntries(w, r, false)
	if !ok {
		return
	}
	out := sandboxLogsV1{Logs: make([]sandboxLog, 0, len(entries)), LogEntries: make([]sandboxLogEntry, 0, len(entries)), Entries: entries, Dropped: st.Dropped}
	for _, e := range entries {
		le := logEntry(e)
		out.Logs = append(out.Logs, sandboxLog{Timestamp: le.Timestamp, Line: logLine(e, le)})
		out.LogEntries = append(out.LogEntries, le)
	}
	writeJSON(w, http.StatusOK, out)
}

// GET /v2/sandboxes/{id}/logs: the same filters, plus E2B's cursor= and
// direction=forward|backward (backward: entries up to the cursor, newest
// first).
func (s *Server) sandboxLogsV2(w http.ResponseWriter, r *http.Request) {
	entries, st, ok := s.auditEntries(w, r, true)
	if !ok {
		return
	}
	out := sandboxLogsV2{Logs: make([]sandboxLogEntry, 0, len(entries)), Entries: entries, Dropped: st.Dropped}
	for _, e := range entries {
		out.Logs = append(out.Logs, logEntry(e))
	}
	writeJSON(w, http.StatusOK, out)
}

// auditEntries answers the error itself and reports false when there is
// nothing to serve.
func (s *Server) auditEntries(w http.ResponseWriter, r *http.Request, v2 bool) ([]audit.Entry, audit.Stats, bool) {
	if s.cfg.Audit == nil {
		s.writeErr(w, r, errdefs.NotImplemented("the audit log is not configured on this daemon"))
		return nil, audit.Stats{}, false
	}
	q, backward, err := parseLogQuery(r, v2)
	if err != nil {
		s.writeErr(w, r, err)
		return nil, audit.Stats{}, false
	}
	id := r.PathValue("id")
	// A killed sandbox's log stays readable, to its owner, for as long as
	// its file exists. A log without a recorded owner (kept from before
	// teams) is the admin's.
	if !s.mayReadAudit(r, id) {
		s.writeErr(w, r, errdefs.NotFound("sandbox %q not found", id))
		return nil, audit.Stats{}, false
	}
	entries, st, err := s.cfg.Audit.ReadWithStats(id, q)
	if err != nil {
		s.writeErr(w, r, err)
		return nil, audit.Stats{}, false
	}
	if backward {
		slices.Reverse(entries)
	}
	return entries, st, true
}

func (s *Server) mayReadAudit(r *http.Request, id string) bool {
	live := s.cfg.Manager != nil && s.cfg.Manager.Tracked(id)
	if !live && !s.cfg.Audit.Exists(id) {
		return false
	}
	var team, key string
	var err error
	if live {
		var o tenant.Owner
		o, err = s.cfg.Manager.Owner(r.Context(), id)
		team, key = o.Team, o.Key
	} else {
		team, key, err = s.cfg.Store.SandboxOwner(r.Context(), id)
	}
	if err != nil {
		// No owner recorded: a log kept from before teams, the admin's.
		return errors.Is(err, store.ErrNotFound) && caller(r).Admin
	}
	return caller(r).Can(tenant.Owner{Team: team, Key: key})
}

func parseLogQuery(r *http.Request, v2 bool) (audit.Query, bool, error) {
	v := r.URL.Query()
	q := audit.Query{Decision: v.Get("decision")}
	var timeParams []string
	for _, p := range []string{"since", "start", "cursor"} {
		if v.Has(p) {
			timeParams = append(timeParams, p)
		}
	}
	if len(timeParams) > 1 {
		return q, false, errdefs.InvalidArgument("give one of since, start and cursor (got %s)", strings.Join(timeParams, ", "))
	}
	var at time.Time
	if len(timeParams) == 1 {
		var err error
		if at, err = parseLogTime(timeParams[0], v.Get(timeParams[0])); err != nil {
			return q, false, err
		}
	}
	backward := false
	switch d := v.Get("direction"); {
	case d == "" || d == "forward":
	case d == "backward" && v2:
		backward = true
	default:
		return q, false, errdefs.InvalidArgument("direction must be forward or backward (got %q; only /v2 reads backward)", d)
	}
	if backward {
		q.Until = at
	} else {
		q.Since = at
	}
	if k := v.Get("kind"); k != "" {
		for _, kind := range strings.Split(k, ",") {
			kind = strings.TrimSpace(kind)
			if !slices.Contains(audit.Kinds, kind) {
				return q, false, errdefs.InvalidArgument("unknown kind %q (use a comma-separated list of %s)", kind, strings.Join(audit.Kinds, ", "))
			}
			q.Kind = append(q.Kind, kind)
		}
	}
	if q.Decision != "" && q.Decision != audit.DecisionAllowed && q.Decision != audit.DecisionBlocked {
		return q, false, errdefs.InvalidArgument("decision must be %s or %s (got %q)", audit.DecisionAllowed, audit.DecisionBlocked, q.Decision)
	}
	limit, err := intParam(v, "limit", audit.DefaultLimit, maxLogLimit) // json.go
	if err != nil {
		return q, false, err
	}
	q.Limit = limit
	return q, backward, nil
}

// parseLogTime reads RFC 3339 or Unix milliseconds (what E2B's start and
// cursor carry).
func parseLogTime(param, v string) (time.Time, error) {
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.UnixMilli(ms), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, errdefs.InvalidArgument("%s must be an RFC 3339 time or Unix milliseconds (got %q)", param, v)
	}
	return t, nil
}
