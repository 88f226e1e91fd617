package agent

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/cella-sandbox/cella/internal/channel"
)

// RedialSignal makes the agent drop its channel session and dial the
// daemon again. The daemon sends it after `runsc checkpoint
// --leave-running` (a snapshot): the checkpoint breaks the agent's host
// socket, and the agent would otherwise notice only at its next keepalive.
const RedialSignal = syscall.SIGUSR1

// closeOnRedialSignal closes sess when RedialSignal arrives; the returned
// func stops watching.
func closeOnRedialSignal(sess *channel.AgentSession) func() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, RedialSignal)
	done := make(chan struct{})
	go func() {
		select {
		case <-ch:
			sess.Close()
		case <-done:
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}
