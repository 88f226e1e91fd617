package daemon

import (
	"fmt"
	"log/slog"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/egress"
)

// egressLimits raises the daemon's open-file soft limit to its hard limit
// and gives the egress proxy its share: every connection the proxy carries
// costs two descriptors, and a sandbox holding thousands of them must not
// leave the API, SQLite, the audit log and other sandboxes without any.
// A quarter of the limit (at least 1024) is kept for those: the proxy holds
// at most half of the rest in connections (Total), and refuses any
// connection whose descriptor number says the process is into the second
// half of the reserve (MaxFD), whoever used up the descriptors below.
func egressLimits(perSandbox int, log *slog.Logger) egress.Limits {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		log.Warn("cannot read the open-file limit: the egress proxy's connections are limited per sandbox only", "err", err)
		return egress.Limits{PerSandbox: perSandbox, PerSandboxHint: perSandboxHint}
	}
	if rl.Cur < rl.Max {
		// Go raises it at start already; a daemon built into another
		// program (the tests) may run with less.
		raised := unix.Rlimit{Cur: rl.Max, Max: rl.Max}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &raised); err == nil {
			rl = raised
		}
	}
	limit := int(min(rl.Cur, 1<<30))
	reserve := max(1024, limit/4)
	if reserve > limit/2 {
		reserve = limit / 2
	}
	l := egress.Limits{
		PerSandbox:     perSandbox,
		PerSandboxHint: perSandboxHint,
		Total:          max((limit-reserve)/2, 1),
		MaxFD:          limit - reserve/2,
		TotalHint: fmt.Sprintf("an operator can raise the daemon's open-file limit (now %d: LimitNOFILE= in its systemd unit, or ulimit -n before cella serve)",
			limit),
	}
	per := perSandbox
	if per == 0 {
		per = egress.DefaultMaxConnsPerSandbox
	}
	log.Info("egress connection limits", "open_files", limit, "reserved", reserve, "proxy_total", l.Total, "per_sandbox", per)
	return l
}

const perSandboxHint = "cella serve --egress-max-conns N"
