package errdefs

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"testing"

	"connectrpc.com/connect"
)

// TestKindMapping pins every kind's HTTP status and Connect code: the E2B
// SDKs read both (a 404 or not_found is NotFoundError, invalid_argument is
// InvalidArgumentError, deadline_exceeded a TimeoutError, ...).
func TestKindMapping(t *testing.T) {
	for _, c := range []struct {
		err    error
		kind   Kind
		status int
		code   connect.Code
	}{
		{errors.New("plain"), KindInternal, http.StatusInternalServerError, connect.CodeInternal},
		{InvalidArgument("x"), KindInvalidArgument, http.StatusBadRequest, connect.CodeInvalidArgument},
		{NotFound("x"), KindNotFound, http.StatusNotFound, connect.CodeNotFound},
		{Conflict("x"), KindConflict, http.StatusConflict, connect.CodeAlreadyExists},
		{Unauthenticated("x"), KindUnauthenticated, http.StatusUnauthorized, connect.CodeUnauthenticated},
		{Forbidden("x"), KindForbidden, http.StatusForbidden, connect.CodePermissionDenied},
		{Unavailable("x"), KindUnavailable, http.StatusServiceUnavailable, connect.CodeUnavailable},
		{NotImplemented("x"), KindNotImplemented, http.StatusNotImplemented, connect.CodeUnimplemented},
		{ResourceExhausted("x"), KindResourceExhausted, http.StatusTooManyRequests, connect.CodeResourceExhausted},
		{FailedPrecondition("x"), KindFailedPrecondition, http.StatusBadRequest, connect.CodeFailedPrecondition},
		{DeadlineExceeded("x"), KindDeadlineExceeded, http.StatusGatewayTimeout, connect.CodeDeadlineExceeded},
		{fmt.Errorf("context: %w", NotFound("x")), KindNotFound, http.StatusNotFound, connect.CodeNotFound},
		{Wrap(KindForbidden, fs.ErrPermission), KindForbidden, http.StatusForbidden, connect.CodePermissionDenied},
	} {
		if got := KindOf(c.err); got != c.kind {
			t.Errorf("KindOf(%v) = %d, want %d", c.err, got, c.kind)
		}
		if got := HTTPStatus(c.err); got != c.status {
			t.Errorf("HTTPStatus(%v) = %d, want %d", c.err, got, c.status)
		}
		if got := ConnectCode(c.err); got != c.code {
			t.Errorf("ConnectCode(%v) = %v, want %v", c.err, got, c.code)
		}
		if got := connect.CodeOf(ToConnect(c.err)); got != c.code {
			t.Errorf("CodeOf(ToConnect(%v)) = %v, want %v", c.err, got, c.code)
		}
	}
	// Every kind is in the table: a kind added without its pair would read
	// as a 500 / internal.
	for k := KindInternal; k <= KindDeadlineExceeded; k++ {
		if _, ok := kinds[k]; !ok {
			t.Errorf("kind %d has no HTTP status and Connect code", k)
		}
	}
}

func TestToConnectKeepsTextAndChain(t *testing.T) {
	err := ToConnect(Wrap(KindNotFound, fmt.Errorf("stat /x: %w", fs.ErrNotExist)))
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Message() != "stat /x: file does not exist" {
		t.Fatalf("ToConnect = %v, want a connect error with the wrapped text", err)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ToConnect lost the chain: %v", err)
	}
	own := connect.NewError(connect.CodeAborted, errors.New("own"))
	if got := ToConnect(fmt.Errorf("ctx: %w", own)); got != own {
		t.Errorf("ToConnect of a connect error = %v, want it as is", got)
	}
	if ToConnect(nil) != nil {
		t.Error("ToConnect(nil) != nil")
	}
	if HasKind(errors.New("plain")) || !HasKind(fmt.Errorf("a: %w", Conflict("b"))) {
		t.Error("HasKind wrong")
	}
}
