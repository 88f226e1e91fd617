// Package fslock takes flock(2) locks on files, waiting while a context
// allows: how processes sharing a directory (daemons and CLIs on one
// template cache) take turns. A lock lasts until its release function is
// called or the process dies.
package fslock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Exclusive locks path (created if missing) for this caller alone.
func Exclusive(ctx context.Context, path string) (release func(), err error) {
	return lock(ctx, path, unix.LOCK_EX)
}

// Shared locks path together with other shared holders; Exclusive and
// TryExclusive wait for all of them.
func Shared(ctx context.Context, path string) (release func(), err error) {
	return lock(ctx, path, unix.LOCK_SH)
}

// TryExclusive takes path exclusively if nobody holds it; ok is false
// when someone does.
func TryExclusive(path string) (release func(), ok bool, err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, true, nil
}

func lock(ctx context.Context, path string, how int) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
