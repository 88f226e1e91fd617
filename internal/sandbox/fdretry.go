package sandbox

import (
	"errors"
	"syscall"
	"time"
)

// retryShortOfFDs runs a cleanup step again, a few times over about 2.5 s,
// while it fails for want of file descriptors (EMFILE, ENFILE): unmounting
// reads /proc/self/mountinfo and removing a directory opens it, and a
// failed create must not leave its mounts and directories behind because
// the daemon was out of descriptors at that moment (which is also when
// creates fail).
func retryShortOfFDs(step func() error) error {
	err := step()
	for wait := 10 * time.Millisecond; err != nil && shortOfFDs(err) && wait <= 1280*time.Millisecond; wait *= 2 {
		time.Sleep(wait)
		err = step()
	}
	return err
}

func shortOfFDs(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}
