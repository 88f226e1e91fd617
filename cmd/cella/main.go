// Command cella is the whole of cella in one binary: the daemon (cella
// serve), the client verbs, and the agent that runs as PID 1 in every sandbox.
package main

import (
	"errors"
	"fmt"
	"os"
)

func main() {
	root := newRootCmd()
	if err := root.Execute(); err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			if ee.msg != "" {
				fmt.Fprintln(os.Stderr, "cella:", ee.msg)
			}
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "cella:", err)
		os.Exit(125)
	}
}

// exitError carries a process exit code out of a command: a sandboxed
// command's own exit code is a result, not a cella failure.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }
