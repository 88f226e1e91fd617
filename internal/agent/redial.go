package agent

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cella-sandbox/cella/internal/channel"
)

// RedialSignal makes the agent check its channel session and dial the
// daemon again if the session no longer answers. The daemon sends it after
// `runsc checkpoint --leave-running` (a snapshot): the checkpoint breaks
// the agent's host socket, and the agent would otherwise notice only at its
// next keepalive. Anyone inside the sandbox can send it too, so a session
// that still answers is kept: the signal cannot make the agent give up its
// session to a process dialing in its place.
const RedialSignal = syscall.SIGUSR1

// redialCheck is how long the daemon has to answer the ping.
const redialCheck = 2 * time.Second

// closeOnRedialSignal closes sess when RedialSignal arrives and the daemon
// does not answer on it; the returned func stops watching.
func closeOnRedialSignal(sess *channel.AgentSession) func() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, RedialSignal)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
				if sess.Answers(redialCheck) {
					// Debug: a loop of signals must not fill the log.
					slog.Debug("redial signal: the daemon's session answers; kept")
					continue
				}
				sess.Close()
				return
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}
