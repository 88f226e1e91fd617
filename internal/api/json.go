package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/cella-sandbox/cella/internal/apiwire"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/quota"
)

// errorBody is E2B's error shape: code equals the HTTP status.
type errorBody = apiwire.Error

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	if v != nil {
		_ = json.NewEncoder(w).Encode(v)
	}
}

func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, errorBody{Code: status, Message: fmt.Sprintf(format, args...)})
}

// writeErr maps an error of the shared taxonomy to its status. Internal
// errors keep their text: it is wrapped with context and names what failed.
// A 4xx or a 501 is the caller's (bad input, a feature this daemon lacks)
// and is logged at debug; any other 5xx is the daemon's, at error.
func (s *Server) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	status := errdefs.HTTPStatus(err)
	if d := errdefs.RetryAfterOf(err); d > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(quota.RetryAfter(d)))
	}
	if status >= 500 && status != http.StatusNotImplemented {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	} else {
		s.log.Debug("request refused", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	}
	writeError(w, status, "%s", err.Error())
}

const maxBody = 1 << 20

// decodeBody reads a JSON request body into v. An empty body leaves v as
// is; malformed JSON is an InvalidArgument naming the problem.
func decodeBody(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return errdefs.InvalidArgument("read request body: %v", err)
	}
	if len(body) > maxBody {
		return errdefs.InvalidArgument("request body is larger than %d bytes", maxBody)
	}
	if strings.TrimSpace(string(body)) == "" {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return errdefs.InvalidArgument("invalid JSON body: field %q must be %s", te.Field, te.Type)
		}
		return errdefs.InvalidArgument("invalid JSON body: %v", err)
	}
	return nil
}

// jsonStatusWriter turns a text/plain error answer — the mux's 404/405, an
// http.Error of a library's handler (MCP's, the console's file server) —
// into the JSON error body every client of the API expects. It holds back
// such an answer's text until the handler returns (finish).
type jsonStatusWriter struct {
	http.ResponseWriter
	// status is the text/plain error being rewritten (0: none), text its
	// first bytes.
	status int
	text   []byte
}

// maxErrorText bounds how much of a text/plain error is kept as the message.
const maxErrorText = 4 << 10

func (w *jsonStatusWriter) WriteHeader(status int) {
	if status >= 400 && w.status == 0 && strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		w.status = status
		return
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *jsonStatusWriter) Write(b []byte) (int, error) {
	if w.status != 0 {
		if n := maxErrorText - len(w.text); n > 0 {
			w.text = append(w.text, b[:min(n, len(b))]...)
		}
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// finish writes the JSON answer of a rewritten error. The mux's own texts
// are replaced by what they mean here.
func (w *jsonStatusWriter) finish() {
	if w.status == 0 {
		return
	}
	h := w.Header()
	h.Del("X-Content-Type-Options")
	h.Del("Content-Length")
	msg := strings.TrimSpace(string(w.text))
	switch {
	case w.status == http.StatusNotFound && msg == "404 page not found":
		msg = "no such route (see the API section of the README)"
	case w.status == http.StatusMethodNotAllowed && msg == "Method Not Allowed":
		msg = "method not allowed on this route (allowed: " + h.Get("Allow") + ")"
	case msg == "":
		msg = http.StatusText(w.status)
	}
	writeError(w.ResponseWriter, w.status, "%s", msg)
}

func (w *jsonStatusWriter) Flush() {
	if w.status != 0 {
		return // the rewritten answer is written by finish
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *jsonStatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// intParam reads the query parameter name as an integer from 1 to max; def
// when it is absent or empty.
func intParam(q url.Values, name string, def, max int) (int, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > max {
		return 0, errdefs.InvalidArgument("%s must be an integer from 1 to %d (got %q)", name, max, v)
	}
	return n, nil
}
