// Command cella-agent is the agent that runs as PID 1 inside every cella
// sandbox. It is its own small binary, not a subcommand of
// cella, because a sandbox pays for every page of its agent's binary and
// every package init at each cold start (under gVisor each page comes
// through the sentry): it links internal/agent and what that needs, none of
// the daemon, CLI or console. cella embeds it (internal/agentbin; `make
// build` builds it first) and writes it out for its sandboxes.
//
// GOMAXPROCS is taken from the sandbox's CPU limit at start, and not read
// again every second (Go's default since 1.25): the limit does not change
// while a sandbox runs, and under gVisor that once-a-second read (a
// sched_getaffinity and a pread of cpu.max, and the scheduler's wake-ups
// around them) was most of what an idle sandbox cost its host.
//
//go:debug updatemaxprocs=0
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/cella-sandbox/cella/internal/agent"
)

func main() {
	args := os.Args[1:]
	switch {
	case len(args) == 0 || len(args) == 1 && args[0] == "agent":
		// "agent" is the argument sandboxes made when the agent was
		// cella's subcommand were booted with; a cold boot of one that was
		// paused without memory passes it still.
		if err := agent.Main(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "cella-agent:", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintln(os.Stderr, "usage: cella-agent [agent]\n(the agent runs as PID 1 of a cella sandbox; it is not a command for people)")
		os.Exit(2)
	}
}
