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

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/quota"
)

// errorBody is E2B's error shape: code equals the HTTP status.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

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
func (s *Server) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	status := errdefs.Status(err)
	if d := errdefs.RetryAfterOf(err); d > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(quota.RetryAfter(d)))
	}
	if status >= 500 {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
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

// jsonStatusWriter turns the mux's plain-text 404/405 answers into the JSON
// error body every client of the API expects.
type jsonStatusWriter struct {
	http.ResponseWriter
	rewrote bool
}

func (w *jsonStatusWriter) WriteHeader(status int) {
	if (status == http.StatusNotFound || status == http.StatusMethodNotAllowed) &&
		strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		w.rewrote = true
		w.Header().Del("X-Content-Type-Options")
		msg := "no such route (see the API section of the README)"
		if status == http.StatusMethodNotAllowed {
			msg = "method not allowed on this route (allowed: " + w.Header().Get("Allow") + ")"
		}
		writeError(w.ResponseWriter, status, "%s", msg)
		return
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *jsonStatusWriter) Write(b []byte) (int, error) {
	if w.rewrote {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

func (w *jsonStatusWriter) Flush() {
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
