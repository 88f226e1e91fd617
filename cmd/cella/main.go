// Command cella is the whole of cella in one binary: the daemon (cella
// serve) and the client verbs, with the agent that runs as PID 1 in every
// sandbox (cmd/cella-agent) embedded (internal/agentbin).
package main

import (
	"errors"
	"fmt"
	"os"
)

func main() {
	root := newRootCmd()
	if cmd, err := root.ExecuteC(); err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			if ee.msg != "" {
				fmt.Fprintln(os.Stderr, "cella:", ee.msg)
			}
			os.Exit(ee.code)
		}
		prefix := "cella"
		if cmd != nil && cmd.Annotations[errorPrefix] != "" {
			prefix = cmd.Annotations[errorPrefix]
		}
		fmt.Fprintln(os.Stderr, prefix+":", err)
		os.Exit(125)
	}
}

// errorPrefix is the annotation of a command whose errors are printed
// after its own name rather than "cella:" (the daemon's: "cella serve:").
const errorPrefix = "cella/error-prefix"

// exitError carries a process exit code out of a command: a sandboxed
// command's own exit code is a result, not a cella failure.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }
