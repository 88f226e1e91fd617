package agent

import (
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/channel"
)

// redialCheck is how long the daemon has to answer the ping.
const redialCheck = 2 * time.Second

// closeOnRedialSignal closes sess when agentapi.RedialSignal arrives (the
// daemon sends it after a snapshot, and anyone inside the sandbox can too, so
// a session that still answers is kept) and the daemon
// does not answer on it; the returned func stops watching.
func closeOnRedialSignal(sess *channel.AgentSession) func() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, agentapi.RedialSignal)
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
