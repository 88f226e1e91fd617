// Package errdefs is cella's error taxonomy. Core packages return errors of
// these kinds; the API maps each kind to an HTTP status once (Status), so the
// same failure reads the same everywhere.
package errdefs

import (
	"errors"
	"fmt"
	"net/http"
	"time"
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
)

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

func newf(k Kind, format string, args ...any) error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, args...)}
}

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

// Status maps an error to its HTTP status.
func Status(err error) int {
	switch KindOf(err) {
	case KindInvalidArgument:
		return http.StatusBadRequest
	case KindNotFound:
		return http.StatusNotFound
	case KindConflict:
		return http.StatusConflict
	case KindUnauthenticated:
		return http.StatusUnauthorized
	case KindForbidden:
		return http.StatusForbidden
	case KindUnavailable:
		return http.StatusServiceUnavailable
	case KindNotImplemented:
		return http.StatusNotImplemented
	case KindResourceExhausted:
		return http.StatusTooManyRequests
	default:
		return http.StatusInternalServerError
	}
}
