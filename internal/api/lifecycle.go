package api

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/apiwire"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/sandbox"
)

// lifecycleRequest is cella's "lifecycle" create field. Each policy takes
// one of: <name>Seconds, <name>Minutes (autoStop) or <name>Days (autoArchive,
// autoDelete) as a number (fractions allowed), or <name> as a Go duration
// string ("90s", "15m", "36h"). A policy left out takes the daemon's default
// (cella serve --auto-stop/--auto-archive/--auto-delete); 0 turns it off.
// onTimeout ("kill"|"pause") and autoResume mirror E2B's autoPause and
// autoResume.enabled. Not apiwire.LifecycleRequest: it is decoded strictly
// (unknown fields refused) and json's messages name this type and its
// field types, which the answers have always shown.
type lifecycleRequest struct {
	AutoStop           *string  `json:"autoStop"`
	AutoStopSeconds    *float64 `json:"autoStopSeconds"`
	AutoStopMinutes    *float64 `json:"autoStopMinutes"`
	AutoArchive        *string  `json:"autoArchive"`
	AutoArchiveSeconds *float64 `json:"autoArchiveSeconds"`
	AutoArchiveDays    *float64 `json:"autoArchiveDays"`
	AutoDelete         *string  `json:"autoDelete"`
	AutoDeleteSeconds  *float64 `json:"autoDeleteSeconds"`
	AutoDeleteDays     *float64 `json:"autoDeleteDays"`
	OnTimeout          *string  `json:"onTimeout"`
	AutoResume         *bool    `json:"autoResume"`
}

const day = 24 * time.Hour

// pickDuration resolves one policy from its alternative fields; def when
// none is set.
func pickDuration(name string, def time.Duration, str *string, secs *float64, unitName string, unit time.Duration, n *float64) (time.Duration, error) {
	set := 0
	d := def
	if str != nil {
		set++
		v, err := time.ParseDuration(*str)
		if err != nil {
			return 0, errdefs.InvalidArgument("lifecycle.%s: %v (use e.g. \"90s\", \"15m\", \"48h\")", name, err)
		}
		d = v
	}
	for _, f := range []struct {
		v              *float64
		field, unitStr string
		unit           time.Duration
	}{{secs, name + "Seconds", "seconds", time.Second}, {n, name + unitName, strings.ToLower(unitName), unit}} {
		if f.v == nil {
			continue
		}
		set++
		v, err := units("lifecycle."+f.field, *f.v, f.unit, f.unitStr, sandbox.MaxLifecycleDuration) // bounds.go
		if err != nil {
			return 0, err
		}
		d = v
	}
	if set > 1 {
		return 0, errdefs.InvalidArgument("lifecycle.%s is given more than once: use one of %s, %sSeconds, %s%s", name, name, name, name, unitName)
	}
	return d, nil
}

// applyLifecycle fills opts.Lifecycle (the daemon's defaults, def, for what
// raw leaves out) and E2B's autoPause/autoResume from the lifecycle object.
func applyLifecycle(opts *sandbox.Options, raw json.RawMessage, def sandbox.Lifecycle) error {
	opts.Lifecycle = def
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var lr lifecycleRequest
	dec := json.NewDecoder(bytesReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&lr); err != nil {
		return errdefs.InvalidArgument("invalid lifecycle: %v", err)
	}
	var err error
	if opts.Lifecycle.AutoStop, err = pickDuration("autoStop", def.AutoStop, lr.AutoStop, lr.AutoStopSeconds, "Minutes", time.Minute, lr.AutoStopMinutes); err != nil {
		return err
	}
	if opts.Lifecycle.AutoArchive, err = pickDuration("autoArchive", def.AutoArchive, lr.AutoArchive, lr.AutoArchiveSeconds, "Days", day, lr.AutoArchiveDays); err != nil {
		return err
	}
	if opts.Lifecycle.AutoDelete, err = pickDuration("autoDelete", def.AutoDelete, lr.AutoDelete, lr.AutoDeleteSeconds, "Days", day, lr.AutoDeleteDays); err != nil {
		return err
	}
	if lr.OnTimeout != nil {
		switch *lr.OnTimeout {
		case "kill":
			opts.AutoPause = false
		case "pause":
			opts.AutoPause = true
		default:
			return errdefs.InvalidArgument("lifecycle.onTimeout must be kill or pause (got %q)", *lr.OnTimeout)
		}
	}
	if lr.AutoResume != nil {
		opts.AutoResume = *lr.AutoResume
	}
	return opts.Lifecycle.Validate()
}

// applyVolumeMounts parses E2B's volumeMounts ([{"name","path"}] plus cella's
// "readOnly").
func applyVolumeMounts(opts *sandbox.Options, raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	// Not apiwire.SandboxVolumeMount: json's messages for a bad item name
	// the Go type, and the answers have always shown this one's.
	var items []struct {
		Name     string `json:"name"`
		Path     string `json:"path"`
		ReadOnly bool   `json:"readOnly"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return errdefs.InvalidArgument("invalid volumeMounts: %v (want [{\"name\": \"vol\", \"path\": \"/mnt/vol\", \"readOnly\": false}])", err)
	}
	for _, it := range items {
		opts.Volumes = append(opts.Volumes, sandbox.VolumeMount{Name: it.Name, Path: it.Path, ReadOnly: it.ReadOnly})
	}
	return sandbox.ValidateVolumeMounts(opts.Volumes)
}

// lifecycleOf is the "lifecycle" of GET /sandboxes/{id}: E2B's
// onTimeout/autoResume plus cella's policies (in seconds, 0 = off), the
// idle clock and the archive state.
func lifecycleOf(in sandbox.Info) apiwire.SandboxLifecycle {
	li := in.Lifecycle
	return apiwire.SandboxLifecycle{
		OnTimeout: apiwire.SandboxOnTimeout(onTimeout(in.Options)), AutoResume: in.Options.AutoResume,
		AutoStopSeconds:    li.Policy.AutoStop.Seconds(),
		AutoArchiveSeconds: li.Policy.AutoArchive.Seconds(),
		AutoDeleteSeconds:  li.Policy.AutoDelete.Seconds(),
		LastActivityAt:     li.LastActivityAt,
		PausedAt:           li.PausedAt, // omitted when zero
		Archived:           li.Archived, ArchivePath: li.ArchivePath,
	}
}

// nextTransitionOf is nextTransition: what happens next on its own, when.
func nextTransitionOf(in sandbox.Info) *apiwire.SandboxTransition {
	if in.Lifecycle.Next == nil {
		return nil
	}
	n := in.Lifecycle.Next
	return &apiwire.SandboxTransition{Action: apiwire.SandboxTransitionAction(n.Action), At: n.At, Reason: n.Reason}
}

// volumeMountsOf is the volumeMounts of the detail and the list.
func volumeMountsOf(in sandbox.Info) []apiwire.SandboxVolumeMountDetail {
	out := make([]apiwire.SandboxVolumeMountDetail, 0, len(in.Options.Volumes))
	for _, v := range in.Options.Volumes {
		out = append(out, apiwire.SandboxVolumeMountDetail{Name: v.Name, Path: v.Path, ReadOnly: v.ReadOnly})
	}
	return out
}
