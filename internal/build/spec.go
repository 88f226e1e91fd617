// Package build makes templates from a base and steps: E2B's template
// build model (../shared/e2b-template-api.md §3, §8), which Dockerfiles and
// `cella template build` are translated into. Every step runs inside a
// gVisor sandbox of the template being built (never on the host); each
// step's copy-on-write upper layer becomes the template's next layer in the
// layer store, cached by a key chained over the parent's key, the step and
// its files' hash; a start command is captured running in a memory
// snapshot.
//
// This file is the contract between the engine (this package) and its
// callers (internal/api's E2B build routes, the CLI, the Dockerfile
// frontend): the request, its log, its errors.
package build

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cella-sandbox/cella/internal/tenant"
)

// Step types, as E2B's SDK sends them (compared upper-cased). ADD and ARG
// are accepted as COPY and ENV, as E2B's executor does.
const (
	StepRun     = "RUN"
	StepCopy    = "COPY"
	StepEnv     = "ENV"
	StepWorkdir = "WORKDIR"
	StepUser    = "USER"
)

// Step is one instruction: E2B's TemplateStep, the JSON the SDK sends.
//
//	RUN     [cmd] or [cmd, user]
//	COPY    [src, dest, owner, mode] (always four; "" when unset), FilesHash
//	ENV     [k1, v1, k2, v2, ...]
//	WORKDIR [path]
//	USER    [name] or [name, "true"] (add to sudoers)
type Step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	Force     bool     `json:"force"`
	FilesHash string   `json:"filesHash,omitempty"`
}

// Base is what a build starts from: exactly one of Image or Template.
type Base struct {
	// Image is an image reference as template.Store.Pull takes it: a
	// registry reference, oci-archive:PATH, docker-archive:PATH or oci:DIR.
	Image string `json:"image,omitempty"`
	// Template is another template's name ("base", a builtin, or a built
	// one, with an optional :tag); its layers are the base and are always
	// cached, its start and ready commands are inherited unless the spec
	// sets its own.
	Template string `json:"template,omitempty"`
	// Username and Password authenticate the image pull (E2B's
	// fromImageRegistry); empty: the daemon's registry settings.
	Username string `json:"-"`
	Password string `json:"-"`
}

// Spec is a whole build request.
type Spec struct {
	// Name is the template (or alias) the build makes or replaces; Tags
	// name this build too (E2B's name:tag).
	Name string
	Tags []string
	Base Base
	// Steps run in order; a step is cached by Key(parent, step).
	Steps []Step
	// Force rebuilds the base and every step (E2B's skipCache / top-level
	// force); a step's own Force rebuilds it and every step after it.
	Force bool
	// StartCmd runs in the background after the last step; ReadyCmd is
	// retried until it exits 0 (E2B's default: "sleep 20" with a start
	// command, none without); then the running sandbox is snapshotted and
	// sandboxes of the template start from that snapshot.
	StartCmd string
	ReadyCmd string
	// CPUs, MemoryMB and DiskMB size the build sandbox and become the
	// template's defaults; 0: the daemon's defaults.
	CPUs     int
	MemoryMB int
	DiskMB   int
	// Timeout bounds the whole build; 0: the daemon's build timeout.
	Timeout time.Duration
}

// Files gives the archive of a COPY step's files by its FilesHash: a tar,
// gzipped or not (E2B §4.2; the reader detects which), whose entries are
// the step's sources relative to the build context.
type Files interface {
	Open(ctx context.Context, filesHash string) (io.ReadCloser, error)
}

// Log levels, E2B's.
const (
	LevelDebug = "debug"
	LevelInfo  = "info"
	LevelWarn  = "warn"
	LevelError = "error"
)

// LogEntry is one line of a build's log, E2B's shape: Step is "base", the
// 1-based index of the step in Spec.Steps as a decimal string, "finalize",
// or empty for lines of the whole build.
type LogEntry struct {
	Time    time.Time `json:"timestamp"`
	Level   string    `json:"level"`
	Message string    `json:"message"`
	Step    string    `json:"step,omitempty"`
}

// Result is what a successful build made.
type Result struct {
	// Template is the name the build installed (Spec.Name).
	Template string
	// Digest identifies this build's image (content of its layers and
	// config); Layers its layers' diffIDs bottom first.
	Digest string
	Layers []string
	// Cached lists the steps ("base", "1", ...) served from the cache.
	Cached []string
	// Snapshot is the memory snapshot sandboxes start from when the
	// template has a start command ("" without).
	Snapshot string
}

// Builder builds templates. Build runs the spec as p (the template and
// its cache entries belong to p's team), sends each log line to log as it
// happens (log must not block for long), and returns the result or an
// error; a failing step's error is a *StepError.
type Builder interface {
	Build(ctx context.Context, p tenant.Principal, spec Spec, files Files, log func(LogEntry)) (Result, error)
}

// Starter captures an installed template's start command running, as a
// build's finalize does: what a cluster node does with a build it pulled
// (a memory snapshot is the node's own; the registry holds the layers and
// the image's start and ready commands). CaptureStart boots template name
// with sizes as p's build would (the build egress within p's ceiling),
// runs its start command, waits for its ready command and names the
// memory snapshot sandboxes of name start from; a template with neither
// command is left as it is.
type Starter interface {
	CaptureStart(ctx context.Context, p tenant.Principal, name string, sizes Sizes, log func(LogEntry)) error
}

// Sizes are a build sandbox's vCPUs and memory (0: the daemon's defaults).
type Sizes struct {
	CPUs, MemoryMB int
}

// StepError is a build that failed at one step: E2B's reason {message,
// step}. Message is what E2B's reason.message would say (e.g. "failed to
// run command 'false': exit status 1").
type StepError struct {
	Step    string // "base", "1".."N", "finalize"
	Message string
	Err     error
}

func (e *StepError) Error() string {
	if e.Step == "" {
		return e.Message
	}
	return fmt.Sprintf("step %s: %s", e.Step, e.Message)
}

func (e *StepError) Unwrap() error { return e.Err }

// FailedStep returns the step and message of err if it is a *StepError.
func FailedStep(err error) (step, message string, ok bool) {
	var se *StepError
	if !errors.As(err, &se) {
		return "", "", false
	}
	return se.Step, se.Message, true
}
