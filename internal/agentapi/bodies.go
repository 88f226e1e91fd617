package agentapi

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"time"
)

// InitRequest is envd's POST /init body; the agent accepts and ignores the
// fields of envd's it does not use. Nil fields leave the agent's value as it
// is; EnvVars are merged into its environment.
type InitRequest struct {
	EnvVars        map[string]string `json:"envVars,omitempty"`
	AccessToken    *string           `json:"accessToken,omitempty"`
	DefaultUser    *string           `json:"defaultUser,omitempty"`
	DefaultWorkdir *string           `json:"defaultWorkdir,omitempty"`
	// SandboxID is cella's: a sandbox restored from another's snapshot
	// learns its own identity.
	SandboxID *string `json:"cellaSandboxID,omitempty"`
}

// ChannelTokenRequest is the body of POST ChannelTokenPath.
type ChannelTokenRequest struct {
	Token string `json:"token"`
}

// SpawnRequest is the body of POST SpawnPath: Count times, the agent
// starts `bash -l -c true` (E2B's command shape) as the request's user,
// with the environment and working directory an exec gets, twice: once
// bare (fork, exec, wait: the spawn floor) and once through the path an
// exec's command takes (its Landlock ruleset or commands cgroup, pipes,
// output readers, the end event), neither in the process table, the
// process logs nor the audit feed.
type SpawnRequest struct {
	Count int `json:"count"`
	// ThroughConnect also starts the command once through the agent's own
	// envd process service, in each of Connect's codecs (proto and JSON),
	// as quietly as the spawns: what a client's first exec would otherwise
	// set up on its way (the codecs, the process service's types).
	ThroughConnect bool `json:"throughConnect,omitempty"`
}

// MaxSpawnCount bounds SpawnRequest.Count.
const MaxSpawnCount = 200

// SpawnResult has the wall time of each start, in nanoseconds.
type SpawnResult struct {
	FloorNs []int64 `json:"floorNs"`
	PathNs  []int64 `json:"pathNs"`
}

// MinChannelToken is the shortest credential the agent takes.
const MinChannelToken = 32

// AuditEvent is one thing the agent did on the API's behalf that the
// daemon's audit log keeps: a process started or ended, a file written,
// made, moved or removed. The daemon follows them with GET EventsPath and
// stores them outside the sandbox, so deleting anything inside does not
// rewrite history.
type AuditEvent struct {
	Seq      uint64    `json:"seq"`
	Time     time.Time `json:"time"`
	Kind     string    `json:"kind"` // process.start, process.exit, file.write, file.mkdir, file.move, file.remove
	PID      int       `json:"pid,omitempty"`
	Cmd      string    `json:"cmd,omitempty"`
	User     string    `json:"user,omitempty"`
	Cwd      string    `json:"cwd,omitempty"`
	ExitCode *int32    `json:"exitCode,omitempty"`
	Status   string    `json:"status,omitempty"`
	Path     string    `json:"path,omitempty"`
	Size     int64     `json:"size,omitempty"`
	Error    string    `json:"error,omitempty"`
}

// KindKeepalive is the kind of the lines that fill an idle events stream;
// their Seq is the last event's.
const KindKeepalive = "keepalive"

// LogEntry is one line of GET ProcessLogsPath(pid)?format=json.
type LogEntry struct {
	Time    time.Time `json:"time"`
	Stream  string    `json:"stream"`
	Line    string    `json:"line"`
	Partial bool      `json:"partial,omitempty"`
}

// ProcessLogs is the JSON body of the logs endpoint.
type ProcessLogs struct {
	PID          int        `json:"pid"`
	Cmd          string     `json:"cmd"`
	Running      bool       `json:"running"`
	ExitCode     *int32     `json:"exitCode,omitempty"`
	Status       string     `json:"status,omitempty"`
	StartedAt    time.Time  `json:"startedAt"`
	EndedAt      *time.Time `json:"endedAt,omitempty"`
	DroppedBytes int64      `json:"droppedBytes"`
	MaxBytes     int        `json:"maxBytes"`
	Lines        []LogEntry `json:"lines"`
}

// WaitResult is the body of a wait (WaitPath): 200 when ready, 408 on
// timeout, 409 when the watched process ended first.
type WaitResult struct {
	Ready     bool   `json:"ready"`
	Port      int    `json:"port,omitempty"`
	PID       int    `json:"pid,omitempty"`
	Line      string `json:"line,omitempty"`
	ElapsedMs int64  `json:"elapsedMs"`
	Code      int    `json:"code,omitempty"`
	Message   string `json:"message,omitempty"`
}

// Signature builds the v1 signature of a signed /files URL, as the SDKs do:
// v1_ + base64(sha256("<path>:<read|write>:<user>:<token>[:<exp>]")) without
// padding. expiration 0 means none. A request with ?signature= (and
// ?signature_expiration=) needs no access token.
func Signature(path, operation, username, token string, expiration int64) string {
	parts := []string{path, operation, username, token}
	if expiration != 0 {
		parts = append(parts, strconv.FormatInt(expiration, 10))
	}
	sum := sha256.Sum256([]byte(strings.Join(parts, ":")))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}
