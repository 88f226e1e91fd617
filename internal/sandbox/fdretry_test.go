package sandbox

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
)

func TestRetryShortOfFDs(t *testing.T) {
	calls := 0
	err := retryShortOfFDs(func() error {
		calls++
		if calls < 3 {
			return fmt.Errorf("unmount: %w", &os.PathError{Op: "open", Path: "/proc/self/mountinfo", Err: syscall.EMFILE})
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Errorf("short of descriptors twice: %v after %d calls", err, calls)
	}
	calls = 0
	other := errors.New("device busy")
	if err := retryShortOfFDs(func() error { calls++; return other }); err != other || calls != 1 {
		t.Errorf("another error: %v after %d calls, want one call", err, calls)
	}
}
