// Package agent is cella's in-sandbox agent: PID 1 of every sandbox and a
// drop-in for E2B's envd.
//
// Main reads the config the daemon wrote to /run/cella/config.json, takes
// on PID 1's duties (reaping every orphan through one Reaper, clean shutdown
// on SIGTERM/SIGINT), dials the daemon's unix socket (package channel) and
// serves the streams the daemon opens: the agent's own API on
// channel.AgentPort, any other port piped to 127.0.0.1:<port>. The same API
// is also served on 127.0.0.1:49983 for programs inside the sandbox.
//
// The API (Server.Handler) is envd's wire protocol: the Connect services
// process.Process and filesystem.Filesystem (JSON codec, as the SDKs use
// it), and the plain endpoints /health, /envs, /files and /init, with
// envd's auth rules (X-Access-Token, Basic-auth user, v1 signed URLs).
// cella adds /cella/tar for copying directories.
//
// Commands run in their own session and process group, as the request's
// user, with an environment built from scratch. The agent enforces the
// sandbox's nominal limits below the host's cgroup ceilings so that a
// runaway command is killed with an error that names the limit and the flag
// that raises it (limits.go); under the namespaces runtime every command is
// additionally confined with Landlock, forked from a thread that restricted
// itself (landlock.go).
package agent
