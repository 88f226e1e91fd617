package audit

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Kinds of entry.
const (
	KindConnect      = "connect"       // a sandbox's outbound connection (proxy)
	KindDNS          = "dns"           // a name lookup (proxy)
	KindProcessStart = "process.start" // a process started (agent)
	KindProcessExit  = "process.exit"  // a process ended (agent)
	KindFileWrite    = "file.write"    // a file written through the API
	KindFileMkdir    = "file.mkdir"    // a directory made through the API
	KindFileMove     = "file.move"     // a file moved through the API
	KindFileRemove   = "file.remove"   // a file removed through the API
	KindLifecycle    = "lifecycle"     // create, pause, resume, kill; and the log's own notes
	KindSecurity     = "security"      // something the daemon refused from inside a sandbox (a fake agent's hello)
)

// Kinds lists every kind, for validating filters.
var Kinds = []string{KindConnect, KindDNS, KindProcessStart, KindProcessExit,
	KindFileWrite, KindFileMkdir, KindFileMove, KindFileRemove, KindLifecycle, KindSecurity}

// Sources of entry.
const (
	SourceProxy  = "proxy"
	SourceDaemon = "daemon"
	SourceAgent  = "agent"
)

// Who saw what an entry records, as its Observed field says: the daemon
// itself (the proxy's decisions, what it did to the sandbox, what it
// refused), or a process inside the sandbox that reported it (the agent:
// processes and files). A sandbox's root cannot forge or suppress the
// former; the latter are what the agent saw, in a sandbox whose root
// controls everything but the agent's memory.
const (
	ObservedDaemon  = "daemon"
	ObservedSandbox = "sandbox"
)

// ObservedBy is who saw the entries of a source.
func ObservedBy(source string) string {
	if source == SourceAgent {
		return ObservedSandbox
	}
	return ObservedDaemon
}

// Decisions of the egress proxy.
const (
	DecisionAllowed = "allowed"
	DecisionBlocked = "blocked"
)

// Entry is one audit record: a flat struct whose optional fields are left
// out of the JSON when empty, so each kind carries only what it has.
type Entry struct {
	Time      time.Time `json:"time"`
	SandboxID string    `json:"sandboxId"`
	Kind      string    `json:"kind"`
	Source    string    `json:"source"`
	// Observed is ObservedBy(Source), set by the log itself: whether the
	// daemon saw this happen or a process inside the sandbox reported it.
	Observed string `json:"observed,omitempty"`
	// Seq is the source's own sequence number, if it numbers its events
	// (the agent does), so a follower that restarts can resume after it.
	Seq uint64 `json:"seq,omitempty"`

	// Network (connect, dns).
	Proto    string `json:"proto,omitempty"`    // http, tls, tcp or dns
	Dst      string `json:"dst,omitempty"`      // ip:port the sandbox dialed
	Host     string `json:"host,omitempty"`     // SNI, Host header or looked-up name
	Upstream string `json:"upstream,omitempty"` // where the proxy actually connected
	Decision string `json:"decision,omitempty"` // allowed | blocked
	Rule     string `json:"rule,omitempty"`     // the rule that decided
	Reason   string `json:"reason,omitempty"`   // why it was blocked or failed
	BytesOut int64  `json:"bytesOut,omitempty"`
	BytesIn  int64  `json:"bytesIn,omitempty"`

	// Processes.
	PID  int    `json:"pid,omitempty"`
	Cmd  string `json:"cmd,omitempty"`
	User string `json:"user,omitempty"`
	Cwd  string `json:"cwd,omitempty"`
	// ExitCode is a pointer because 0 is an exit code worth recording.
	ExitCode *int   `json:"exitCode,omitempty"`
	Status   string `json:"status,omitempty"` // how a process ended, e.g. "signal: killed"

	// Files.
	Path string `json:"path,omitempty"`
	Size int64  `json:"size,omitempty"`

	// Error is a failure of the recorded operation.
	Error   string `json:"error,omitempty"`
	Message string `json:"message,omitempty"`

	// Dropped, on the log's own notes, counts the entries the note stands
	// for that are not in the file: cut by the size cap, not recorded one
	// by one under a flood, or lost behind a stuck writer. The sum over a
	// file's notes is all it ever dropped.
	Dropped *Dropped `json:"dropped,omitempty"`
}

// Dropped counts entries by what they recorded.
type Dropped struct {
	Blocked int64 `json:"blocked"` // decisions the proxy refused
	Allowed int64 `json:"allowed"` // decisions the proxy allowed (routine)
	Other   int64 `json:"other"`   // processes, files, lifecycle
}

// Add adds d's counts to c.
func (c *Dropped) Add(d Dropped) {
	c.Blocked += d.Blocked
	c.Allowed += d.Allowed
	c.Other += d.Other
}

// Total is the number of entries counted.
func (c Dropped) Total() int64 { return c.Blocked + c.Allowed + c.Other }

// count adds one entry of e's class.
func (c *Dropped) count(e Entry) {
	switch e.Decision {
	case DecisionBlocked:
		c.Blocked++
	case DecisionAllowed:
		c.Allowed++
	default:
		c.Other++
	}
}

func (c Dropped) String() string {
	return fmt.Sprintf("%d blocked, %d allowed, %d other", c.Blocked, c.Allowed, c.Other)
}

// Blocked reports whether the entry records something the proxy refused.
func (e Entry) Blocked() bool { return e.Decision == DecisionBlocked }

// Fields returns the entry as key/value strings, keyed by its JSON names,
// with empty optional fields left out.
func (e Entry) Fields() map[string]string {
	f := map[string]string{
		"time":      e.Time.UTC().Format(time.RFC3339Nano),
		"sandboxId": e.SandboxID,
		"kind":      e.Kind,
		"source":    e.Source,
		"observed":  ObservedBy(e.Source),
	}
	for _, kv := range e.optional() {
		f[kv[0]] = kv[1]
	}
	return f
}

// optional lists the set optional fields in a fixed order (the order Line
// prints them in).
func (e Entry) optional() [][2]string {
	var out [][2]string
	add := func(k, v string) {
		if v != "" {
			out = append(out, [2]string{k, v})
		}
	}
	addInt := func(k string, v int64) {
		if v != 0 {
			out = append(out, [2]string{k, strconv.FormatInt(v, 10)})
		}
	}
	add("decision", e.Decision)
	add("proto", e.Proto)
	add("host", e.Host)
	add("dst", e.Dst)
	add("upstream", e.Upstream)
	add("rule", e.Rule)
	add("reason", e.Reason)
	addInt("bytesOut", e.BytesOut)
	addInt("bytesIn", e.BytesIn)
	addInt("pid", int64(e.PID))
	add("cmd", e.Cmd)
	add("user", e.User)
	add("cwd", e.Cwd)
	if e.ExitCode != nil {
		out = append(out, [2]string{"exitCode", strconv.Itoa(*e.ExitCode)})
	}
	add("status", e.Status)
	add("path", e.Path)
	addInt("size", e.Size)
	add("error", e.Error)
	if e.Dropped != nil {
		out = append(out, [2]string{"dropped", e.Dropped.String()})
	}
	if e.Seq != 0 {
		out = append(out, [2]string{"seq", strconv.FormatUint(e.Seq, 10)})
	}
	add("message", e.Message)
	return out
}

// Line renders the entry as one human-readable line, e.g.
//
//	connect blocked host=evil.example dst=203.0.113.9:443 rule=default reason="not in the allowlist"
func (e Entry) Line() string {
	var b strings.Builder
	b.WriteString(e.Kind)
	for _, kv := range e.optional() {
		switch kv[0] {
		case "decision":
			b.WriteString(" " + kv[1])
		case "message":
			// Last and unquoted: it is prose.
			b.WriteString(": " + kv[1])
		default:
			b.WriteString(" " + kv[0] + "=" + quote(kv[1]))
		}
	}
	return b.String()
}

func quote(v string) string {
	if v == "" || strings.ContainsAny(v, " \t\r\n\"=\\") || !strconv.CanBackquote(v) {
		return strconv.Quote(v)
	}
	return v
}
