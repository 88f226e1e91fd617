package api

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/apiwire"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/volume"
)

// The bodies and queries of the routes that act on a sandbox, a pool, a
// volume or a page: each parse function is all its handler does with the
// request before it acts, so that bad input is an InvalidArgument naming
// the field, whatever it is (fuzz_test.go feeds them arbitrary input).

// optSeconds is an optional whole number of seconds up to max; def when
// absent.
func optSeconds(field string, v *int64, def, max time.Duration) (time.Duration, error) {
	if v == nil {
		return def, nil
	}
	return seconds(field, *v, max) // bounds.go
}

// parseSetTimeout reads POST /sandboxes/{id}/timeout {"timeout": s}.
func parseSetTimeout(r *http.Request) (time.Duration, error) {
	// Not apiwire.SandboxTimeoutRequest: timeout is required, and only a
	// pointer tells it left out from 0.
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(r, &req); err != nil {
		return 0, err
	}
	if req.Timeout == nil {
		return 0, errdefs.InvalidArgument("timeout (seconds) is required")
	}
	return seconds("timeout", *req.Timeout, sandbox.MaxTimeout) // bounds.go
}

// parseRefresh reads POST /sandboxes/{id}/refreshes {"duration"?: s},
// 60 s by default.
func parseRefresh(r *http.Request) (time.Duration, error) {
	var req apiwire.SandboxRefreshRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, err
	}
	return optSeconds("duration", req.Duration, time.Minute, sandbox.MaxTimeout)
}

// parseConnect reads POST /sandboxes/{id}/connect {"timeout"?: s,
// "memory"?: bool}. "memory": false asks for a cold boot of a paused
// sandbox on its kept filesystem (the SDK's onResume: 'reboot').
func parseConnect(r *http.Request) (timeout time.Duration, keepMemory bool, err error) {
	var req apiwire.ConnectSandboxV2
	if err := decodeBody(r, &req); err != nil {
		return 0, false, err
	}
	d, err := optSeconds("timeout", req.Timeout, sandbox.DefaultTimeout, sandbox.MaxTimeout)
	return d, req.Memory == nil || *req.Memory, err
}

// parsePause reads POST /sandboxes/{id}/pause {"memory"?: bool}.
func parsePause(r *http.Request) (keepMemory bool, err error) {
	var req apiwire.SandboxPauseRequest
	if err := decodeBody(r, &req); err != nil {
		return false, err
	}
	return req.Memory == nil || *req.Memory, nil
}

// parseResume reads E2B's deprecated POST /sandboxes/{id}/resume
// {"timeout"?: s}, 15 s by default (the spec's, for ResumedSandbox).
func parseResume(r *http.Request) (time.Duration, error) {
	// Not apiwire.ResumedSandbox: only timeout is read, and the SDKs'
	// other fields must not be refused for their types.
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(r, &req); err != nil {
		return 0, err
	}
	return optSeconds("timeout", req.Timeout, v1DefaultTimeout, sandbox.MaxTimeout)
}

// parseFork reads POST /sandboxes/{id}/fork {"count"?: n, "timeout"?: s}.
func parseFork(r *http.Request) (count int, timeout time.Duration, err error) {
	var req apiwire.SandboxForkRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, 0, err
	}
	count = 1
	if req.Count != nil {
		count = *req.Count
	}
	if count < 1 || count > sandbox.MaxForkCount {
		return 0, 0, errdefs.InvalidArgument("count must be between 1 and %d (got %d)", sandbox.MaxForkCount, count)
	}
	timeout, err = optSeconds("timeout", req.Timeout, 0, sandbox.MaxTimeout)
	return count, timeout, err
}

// parseSnapshot reads POST /sandboxes/{id}/snapshots {"name"?: s}; the
// manager checks the name.
func parseSnapshot(r *http.Request) (string, error) {
	var req apiwire.SandboxSnapshotRequest
	err := decodeBody(r, &req)
	return req.Name, err
}

// parsePoolSize reads PUT /pools/{template} {"size": n}; the manager
// checks its range.
func parsePoolSize(r *http.Request) (int, error) {
	// Not apiwire.PoolSize: size is required, and only a pointer tells it
	// left out from 0 (which removes the pool).
	var req struct {
		Size *int `json:"size"`
	}
	if err := decodeBody(r, &req); err != nil {
		return 0, err
	}
	if req.Size == nil {
		return 0, errdefs.InvalidArgument(`give the pool's size: {"size": N} (0 removes the pool)`)
	}
	return *req.Size, nil
}

// parseVolumeCreate reads POST /volumes {"name", "sizeMB"? | "size"?:
// "1G"}; size 0 is the volume manager's default. The manager checks the
// name.
func parseVolumeCreate(r *http.Request) (name string, size int64, err error) {
	var req apiwire.NewVolume
	if err := decodeBody(r, &req); err != nil {
		return "", 0, err
	}
	switch {
	case req.SizeMB != nil && req.Size != nil:
		return "", 0, errdefs.InvalidArgument("give sizeMB or size, not both")
	case req.SizeMB != nil:
		if *req.SizeMB <= 0 || *req.SizeMB > volume.MaxSizeBytes>>20 {
			return "", 0, errdefs.InvalidArgument("sizeMB must be between %d and %d (got %d)", volume.MinSizeBytes>>20, volume.MaxSizeBytes>>20, *req.SizeMB)
		}
		size = *req.SizeMB << 20
	case req.Size != nil:
		if size, err = parseSize(*req.Size); err != nil {
			return "", 0, err
		}
	}
	return req.Name, size, nil
}

// parseWait reads POST /sandboxes/{id}/wait into the query of the agent's
// GET /cella/wait.
func parseWait(r *http.Request) (url.Values, error) {
	var req apiwire.WaitRequest // timeout: seconds (a number) or a Go duration string
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	timeout, err := parseWaitTimeout(req.Timeout) // wait.go
	if err != nil {
		return nil, err
	}
	q := url.Values{"timeout": {timeout.String()}}
	switch {
	case req.Port != 0 && req.Log != "":
		return nil, errdefs.InvalidArgument("wait for either a port or a log line, not both")
	case req.Port != 0:
		if req.Port < 0 || req.Port > 65535 {
			return nil, errdefs.InvalidArgument("port %d is out of range", req.Port)
		}
		q.Set("port", strconv.Itoa(req.Port))
	case req.Log != "":
		if req.PID <= 0 {
			return nil, errdefs.InvalidArgument("a log wait needs the pid of the process to watch")
		}
		q.Set("log", req.Log)
		q.Set("pid", strconv.Itoa(req.PID))
	default:
		return nil, errdefs.InvalidArgument(`wait for what? send {"port":N} or {"log":"REGEXP","pid":P}`)
	}
	return q, nil
}

// listQuery is GET /v2/sandboxes' query.
type listQuery struct {
	metadata     map[string]string
	states       map[string]bool
	limit        int
	startedAfter time.Time
	template     string
	asc          bool
	// after is the nextToken's position key: StartedAt in Unix
	// nanoseconds and the ID of the last sandbox of the previous page.
	after   bool
	afterNS int64
	afterID string
}

func parseListQuery(q url.Values) (listQuery, error) {
	lq := listQuery{template: q.Get("template"), asc: q.Get("order") == "asc"}
	var err error
	if lq.metadata, err = parseMetadataFilter(q.Get("metadata")); err != nil {
		return lq, err
	}
	lq.states = map[string]bool{sandbox.StateRunning: true, sandbox.StatePaused: true}
	if st := q.Get("state"); st != "" {
		lq.states = map[string]bool{}
		for _, v := range strings.Split(st, ",") {
			v = strings.TrimSpace(v)
			switch v {
			case sandbox.StateRunning, sandbox.StatePaused, sandbox.StateDead:
				lq.states[v] = true
			case "", string(apiwire.SandboxStateLost):
				// A cluster gateway's state (a sandbox its node cannot
				// answer for): no sandbox of a node's own is lost.
			default:
				return lq, errdefs.InvalidArgument("invalid state %q: use running, paused, dead or lost", v)
			}
		}
	}
	if lq.limit, err = intParam(q, "limit", 100, 100); err != nil { // json.go
		return lq, err
	}
	if sa := q.Get("startedAfter"); sa != "" {
		if lq.startedAfter, err = time.Parse(time.RFC3339Nano, sa); err != nil {
			return lq, errdefs.InvalidArgument("startedAfter must be an RFC 3339 time (got %q)", sa)
		}
	}
	if o := q.Get("order"); o != "" && o != "asc" && o != "desc" {
		return lq, errdefs.InvalidArgument("order must be asc or desc (got %q)", o)
	}
	if tok := q.Get("nextToken"); tok != "" {
		ms, id, ok := strings.Cut(tok, "_")
		n, err := strconv.ParseInt(ms, 10, 64)
		if !ok || err != nil {
			return lq, errdefs.InvalidArgument("invalid nextToken %q", tok)
		}
		lq.after, lq.afterNS, lq.afterID = true, n, id
	}
	return lq, nil
}

// parseSnapshotPage reads GET /snapshots' limit and nextToken (an offset).
func parseSnapshotPage(q url.Values) (limit, offset int, err error) {
	limit = maxSnapshotPage
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return 0, 0, errdefs.InvalidArgument("limit must be a positive integer (got %q)", v)
		}
		limit = min(n, maxSnapshotPage)
	}
	if v := q.Get("nextToken"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, 0, errdefs.InvalidArgument("invalid nextToken %q", v)
		}
		offset = n
	}
	return limit, offset, nil
}

// parseSecretPage reads GET /secrets' limit and nextToken (the last name
// of the previous page, base64url).
func parseSecretPage(q url.Values) (limit int, after string, err error) {
	if limit, err = intParam(q, "limit", maxSecretPage, maxSecretPage); err != nil { // json.go
		return 0, "", err
	}
	if tok := q.Get("nextToken"); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(b) == 0 {
			return 0, "", errdefs.InvalidArgument("invalid nextToken %q: pass the X-Next-Token header of the previous page", tok)
		}
		after = string(b)
	}
	return limit, after, nil
}

// parsePTYQuery reads GET /sandboxes/{id}/pty's offset, cols and rows.
func parsePTYQuery(r *http.Request) (offset int64, cols, rows uint32, err error) {
	if v := r.URL.Query().Get("offset"); v != "" {
		if offset, err = strconv.ParseInt(v, 10, 64); err != nil || offset < 0 {
			return 0, 0, 0, errdefs.InvalidArgument("offset must be a byte offset, got %q", v)
		}
	}
	if cols, err = ptySize(r, "cols", 80); err != nil { // pty.go
		return 0, 0, 0, err
	}
	if rows, err = ptySize(r, "rows", 24); err != nil {
		return 0, 0, 0, err
	}
	return offset, cols, rows, nil
}

// parseMetricsWindow reads GET /sandboxes/{id}/metrics?start=&end= (unix
// seconds, both optional); end is the end of the second it names.
func parseMetricsWindow(q url.Values) (start, end time.Time, err error) {
	if start, err = unixSeconds("start", q.Get("start")); err != nil { // bounds.go
		return
	}
	if end, err = unixSeconds("end", q.Get("end")); err != nil {
		return
	}
	if !start.IsZero() && !end.IsZero() && end.Before(start) {
		return start, end, errdefs.InvalidArgument("end (%d) is before start (%d)", end.Unix(), start.Unix())
	}
	if !end.IsZero() {
		end = end.Add(time.Second - time.Nanosecond) // the whole second named
	}
	return start, end, nil
}
