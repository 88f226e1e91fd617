// Package agentapi is the contract between the daemon and the agent inside
// every sandbox: what the daemon writes for the agent to read at boot (the
// config file and its place), the agent's port and socket, the routes of its
// API the daemon calls with their bodies, the access-token rules, and the
// constants both sides must agree on. The agent (internal/agent) implements
// it; the daemon reaches it through internal/agentclient; the transport is
// internal/channel. Only the standard library is imported here, so every
// side can depend on it.
//
// The API is envd's wire protocol (E2B's in-sandbox daemon): the Connect
// services process.Process and filesystem.Filesystem (internal/envd) and the
// plain endpoints below, plus cella's extensions under /cella/.
package agentapi

import (
	"encoding/base64"
	"strconv"
	"syscall"
)

// Version is the envd protocol version the agent implements, reported to
// SDKs as envdVersion. The SDKs gate features on it; everything gated up
// to it works: octet-stream and gzip uploads (0.5.7), file metadata
// (0.6.2), watch events with entries (0.6.3), watching network mounts
// (0.6.4).
const Version = "0.6.4"

// Port is the port of the agent's own API, the same as E2B's envd: a
// channel stream opened for it reaches the agent, any other port is piped to
// 127.0.0.1:<port> inside the sandbox.
const Port = 49983

// LinkHost is the host name of every URL the daemon sends over a sandbox's
// channel (http://LinkHost:PORT/...): the port picks the target inside the
// sandbox, the name only keys the channel transport's idle streams. One
// name for the edge's proxied requests and the daemon's own calls
// (agentclient) lets them share those streams: the pool's warm-up left its
// stream for the first exec after a hand-out, which under another name
// opened a stream and an HTTP connection of its own (namespaces: the first
// exec took 1.3-1.4× the second).
const LinkHost = "sandbox"

// GuestRunDir is where the sandbox's run directory appears inside it
// (read-only): the daemon's socket and, before a cold boot's hello, the
// config file.
const GuestRunDir = "/run/cella"

// SocketName is the daemon's socket in the run directory, which the agent
// dials.
const SocketName = "agent.sock"

// GuestSocketPath is the daemon's socket as the agent sees it.
const GuestSocketPath = GuestRunDir + "/" + SocketName

// Routes of the agent's plain HTTP API the daemon calls.
const (
	HealthPath = "/health" // GET: 204 while the agent serves
	InitPath   = "/init"   // POST InitRequest: 204
	EnvsPath   = "/envs"   // GET: the sandbox-wide environment
	FilesPath  = "/files"  // GET download, POST upload (envd)
	TarPath    = "/cella/tar"
	WaitPath   = "/cella/wait" // GET ?port=N | ?log=RE&pid=P, &timeout=: WaitResult
	// EventsPath follows the audit feed: GET ?after=SEQ streams AuditEvent
	// lines (NDJSON). Served on the channel only.
	EventsPath = "/cella/events"
	// ChannelTokenPath takes the credential of the agent's next hello
	// (POST ChannelTokenRequest: 204). Served on the channel only.
	ChannelTokenPath = "/cella/channel-token"
	// SpawnPath times the agent's own starts of an exec's command shape
	// (POST SpawnRequest: SpawnResult). Served on the channel only; the
	// daemon's warm pools call it to warm what a first exec needs.
	SpawnPath = "/cella/spawn"
	// ProcessLogsPattern is the ServeMux pattern of a process's retained
	// output (ProcessLogsPath).
	ProcessLogsPattern = "/cella/processes/{pid}/logs"
)

// ProcessLogsPath is the path of process pid's retained output: GET
// ?format=json|text&stream=stdout|stderr|pty, ProcessLogs as JSON.
func ProcessLogsPath(pid int) string {
	return "/cella/processes/" + strconv.Itoa(pid) + "/logs"
}

// AccessTokenHeader carries the sandbox's envd access token on every
// request but those that do their own auth (AuthExempt).
const AccessTokenHeader = "X-Access-Token"

// UnauthorizedMessage is envd's answer to a request without a valid access
// token.
const UnauthorizedMessage = "unauthorized access, please provide a valid access token or method signing if supported"

// AuthExempt reports whether the agent serves method+path without checking
// the access token itself first, as envd's WithAuthorization exempts them:
// the health check needs none, /files checks the token or a URL signature
// (Signature), /init its own rule, and the channel's credential endpoint is
// served on the channel only, whose hello authenticated the daemon (a fork
// calls it before it has its own access token).
func AuthExempt(method, path string) bool {
	switch method + " " + path {
	case "GET " + HealthPath, "GET " + FilesPath, "POST " + FilesPath, "POST " + InitPath, "POST " + ChannelTokenPath:
		return true
	}
	return false
}

// DaemonOnly reports whether method+path is a route only the daemon itself
// may call, never traffic through its edge, even with the access token:
// the spawn timing runs the login shell outside the audit feed, which an
// owner who edited the login scripts could otherwise use to run them
// unaudited; the channel's next credential, set by a client, would be a
// credential someone other than the daemon knows, which a process in the
// sandbox could dial the daemon with as the agent; and the audit feed is
// the daemon's record of what happened, read from its store by clients.
func DaemonOnly(method, path string) bool {
	switch method + " " + path {
	case "POST " + SpawnPath, "POST " + ChannelTokenPath, "GET " + EventsPath:
		return true
	}
	return false
}

// UserAuthorization is the Authorization header that names the sandbox user
// a request acts as: Basic auth with the user name and no password, as the
// SDKs send it (the agent ignores the password).
func UserAuthorization(user string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
}

// CommandPidsSlack is how many tasks the agent's commands cgroup allows
// above the sandbox's pids limit (under gVisor): threads count there as in
// any pids cgroup, and the count must be able to pass the limit for the
// agent's watchdog to see it and name it. The daemon sizes the host's
// ceilings above it.
const CommandPidsSlack = 64

// RedialSignal makes the agent check its channel session and dial the
// daemon again if the session no longer answers. The daemon's runtime sends
// it after `runsc checkpoint --leave-running` (a snapshot), which breaks
// the agent's host socket.
const RedialSignal = syscall.SIGUSR1

// ServiceCodeInterpreter is the Config.Services entry that makes the agent
// run E2B's code-interpreter server on 127.0.0.1:49999 (the template
// code-interpreter-v1 names it).
const ServiceCodeInterpreter = "code-interpreter"

// ServiceDocker is the Config.Services entry that makes the agent start
// dockerd when the sandbox boots (the template docker names it), and the
// daemon give the sandbox what a container engine needs inside it.
const ServiceDocker = "docker"
