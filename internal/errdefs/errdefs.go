// Package errdefs is cella's error taxonomy. Core packages and the agent
// return errors of these kinds; each kind has one HTTP status (HTTPStatus,
// for the daemon's REST API) and one Connect code (ConnectCode, for the
// agent's envd services), both in the table below, so the same failure
// reads the same everywhere.
package errdefs

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"
)

// Kind classifies an error.
type Kind int

const (
	KindInternal Kind = iota
	KindInvalidArgument
	KindNotFound
	KindConflict
	KindUnauthenticated
	KindForbidden
	KindUnavailable
	KindNotImplemented
	KindResourceExhausted
	KindFailedPrecondition
	KindDeadlineExceeded
)

// kinds maps each kind to its HTTP status and Connect code. The pairs are
// Connect's own (connect-go's connectCodeToHTTP), so an error reads the same
// over REST and over Connect. KindConflict is Connect's already_exists: the
// daemon's conflicts ("already exists", "already paused") all answer 409,
// and the one the agent raises over Connect is envd's "directory already
// exists".
var kinds = map[Kind]struct {
	status int
	code   connect.Code
}{
	KindInternal:           {http.StatusInternalServerError, connect.CodeInternal},
	KindInvalidArgument:    {http.StatusBadRequest, connect.CodeInvalidArgument},
	KindNotFound:           {http.StatusNotFound, connect.CodeNotFound},
	KindConflict:           {http.StatusConflict, connect.CodeAlreadyExists},
	KindUnauthenticated:    {http.StatusUnauthorized, connect.CodeUnauthenticated},
	KindForbidden:          {http.StatusForbidden, connect.CodePermissionDenied},
	KindUnavailable:        {http.StatusServiceUnavailable, connect.CodeUnavailable},
	KindNotImplemented:     {http.StatusNotImplemented, connect.CodeUnimplemented},
	KindResourceExhausted:  {http.StatusTooManyRequests, connect.CodeResourceExhausted},
	KindFailedPrecondition: {http.StatusBadRequest, connect.CodeFailedPrecondition},
	KindDeadlineExceeded:   {http.StatusGatewayTimeout, connect.CodeDeadlineExceeded},
}

// Error is an error with a kind and a message meant for the caller.
type Error struct {
	Kind Kind
	Msg  string
	Err  error
	// RetryAfter is when a rate-limited request may succeed (0: unknown).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Err != nil && e.Msg == "" {
		return e.Err.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

// newf keeps a %w operand's chain, so errors.Is sees through the kind.
func newf(k Kind, format string, args ...any) error {
	return &Error{Kind: k, Err: fmt.Errorf(format, args...)}
}

// Internal reports a failure of cella itself (a pipe, a fork, a write).
func Internal(format string, args ...any) error { return newf(KindInternal, format, args...) }

// Wrap gives err the kind k, keeping its text and its chain (errors.Is
// still finds what err wraps).
func Wrap(k Kind, err error) error { return &Error{Kind: k, Err: err} }

// InvalidArgument reports bad input.
func InvalidArgument(format string, args ...any) error {
	return newf(KindInvalidArgument, format, args...)
}

// NotFound reports a missing object.
func NotFound(format string, args ...any) error { return newf(KindNotFound, format, args...) }

// Conflict reports a state conflict (already paused, already exists).
func Conflict(format string, args ...any) error { return newf(KindConflict, format, args...) }

// Unauthenticated reports a missing or wrong credential.
func Unauthenticated(format string, args ...any) error {
	return newf(KindUnauthenticated, format, args...)
}

// Forbidden reports a request outside what the caller may do.
func Forbidden(format string, args ...any) error { return newf(KindForbidden, format, args...) }

// Unavailable reports a dependency that cannot serve now.
func Unavailable(format string, args ...any) error { return newf(KindUnavailable, format, args...) }

// NotImplemented reports a feature that does not exist yet.
func NotImplemented(format string, args ...any) error {
	return newf(KindNotImplemented, format, args...)
}

// ResourceExhausted reports a quota or capacity limit.
func ResourceExhausted(format string, args ...any) error {
	return newf(KindResourceExhausted, format, args...)
}

// FailedPrecondition reports a request the object's state does not allow
// (stdin already closed, a watch on a network mount).
func FailedPrecondition(format string, args ...any) error {
	return newf(KindFailedPrecondition, format, args...)
}

// DeadlineExceeded reports an operation that ran out of time.
func DeadlineExceeded(format string, args ...any) error {
	return newf(KindDeadlineExceeded, format, args...)
}

// RateLimited reports a request over a rate that will allow it again after
// retry (the API sends it as Retry-After).
func RateLimited(retry time.Duration, format string, args ...any) error {
	return &Error{Kind: KindResourceExhausted, Msg: fmt.Sprintf(format, args...), RetryAfter: retry}
}

// RetryAfterOf is the RetryAfter of err (0 when it has none).
func RetryAfterOf(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}

// KindOf returns the kind of err (KindInternal when it has none).
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindInternal
}

// Is reports whether err is of kind k.
func Is(err error, k Kind) bool { return err != nil && KindOf(err) == k }

// HasKind reports whether err carries a kind of this taxonomy (an error
// without one is KindInternal to KindOf).
func HasKind(err error) bool {
	var e *Error
	return errors.As(err, &e)
}

// HTTPStatus maps an error to its HTTP status.
func HTTPStatus(err error) int {
	if m, ok := kinds[KindOf(err)]; ok {
		return m.status
	}
	return http.StatusInternalServerError
}

// ConnectCode maps an error to its Connect code; a *connect.Error keeps its
// own.
func ConnectCode(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	if m, ok := kinds[KindOf(err)]; ok {
		return m.code
	}
	return connect.CodeInternal
}

// ToConnect turns err into the *connect.Error of its kind, its message
// being err's text; nil stays nil and a *connect.Error is returned as is.
func ToConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	return connect.NewError(ConnectCode(err), err)
}
