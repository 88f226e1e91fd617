// Package ocicli is what cella's two wrappers of runc-compatible command
// lines, crun (namespaces) and runsc (gvisor), share: running the CLI
// against its state dir with its own log (CLI.Run, Command, LastError), its
// state JSON (State, List), pause and resume, signals, the kill-and-delete
// of Destroy (Remove), a detached start of a bundle (Launch), the probe's
// timed trial container (Probe), and the host side of their containers'
// cgroups, which both put at /cella/<id> (Stats, RemoveOrphans).
//
// What differs stays in the runtime's package: its flags (runsc's
// --platform, --network, --host-uds...; crun's --cgroup-manager), how a
// command is run (crun: in a private mount namespace that hides the hybrid
// cgroup2 hierarchy, runtime-notes §2), its bundle, crun's wait for the
// freezer after pause, runsc's checkpoints, and what a failed probe means.
package ocicli
