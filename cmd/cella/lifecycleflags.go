package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/cella-sandbox/cella/internal/client"
)

// parseLifeDuration reads a Go duration ("90s", "15m", "36h") or days ("7d",
// "0.5d"); "0" is off.
func parseLifeDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" {
		return 0, nil
	}
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(d, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("invalid duration %q (use e.g. 30s, 15m, 12h or 7d)", s)
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("invalid duration %q (use e.g. 30s, 15m, 12h or 7d)", s)
	}
	return d, nil
}

// lifeDuration is a pflag.Value of parseLifeDuration.
type lifeDuration struct{ d *time.Duration }

func (v lifeDuration) String() string {
	if v.d == nil || *v.d == 0 {
		return "0"
	}
	return v.d.String()
}
func (v lifeDuration) Set(s string) error {
	d, err := parseLifeDuration(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}
func (v lifeDuration) Type() string { return "duration" }

// policyFlags are the lifecycle and volume flags of create and run.
type policyFlags struct {
	fs                             *pflag.FlagSet
	autoStop, autoArchive, autoDel time.Duration
	onTimeout                      string
	autoResume                     bool
	volumes                        []string
}

func (p *policyFlags) register(fs *pflag.FlagSet) {
	p.fs = fs
	fs.Var(lifeDuration{&p.autoStop}, "auto-stop", "pause the sandbox after this long idle, e.g. 15m (0 = off; default: the daemon's)")
	fs.Var(lifeDuration{&p.autoArchive}, "auto-archive", "archive the sandbox after this long paused, e.g. 7d (0 = off; default: the daemon's)")
	fs.Var(lifeDuration{&p.autoDel}, "auto-delete", "delete the sandbox after this long paused, e.g. 30d (0 = off; default: the daemon's)")
	fs.StringVar(&p.onTimeout, "on-timeout", "", "what the timeout does: kill (default) or pause")
	fs.BoolVar(&p.autoResume, "auto-resume", false, "resume the paused sandbox on its first request")
	fs.StringArrayVar(&p.volumes, "volume", nil, "mount a volume: NAME:/path[:ro] (repeatable)")
}

func (p *policyFlags) apply(req *client.CreateRequest) error {
	var lc client.Lifecycle
	set := false
	for _, f := range []struct {
		name string
		d    time.Duration
		dst  **float64
	}{{"auto-stop", p.autoStop, &lc.AutoStopSeconds}, {"auto-archive", p.autoArchive, &lc.AutoArchiveSeconds}, {"auto-delete", p.autoDel, &lc.AutoDeleteSeconds}} {
		if p.fs != nil && p.fs.Changed(f.name) {
			*f.dst = client.Seconds(f.d)
			set = true
		}
	}
	switch p.onTimeout {
	case "":
	case "kill", "pause":
		lc.OnTimeout, set = new(client.OnTimeout(p.onTimeout)), true
	default:
		return fmt.Errorf("--on-timeout must be kill or pause (got %q)", p.onTimeout)
	}
	if p.autoResume {
		t := true
		lc.AutoResume, set = &t, true
	}
	if set {
		req.Lifecycle = lc
	}
	for _, v := range p.volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
			return fmt.Errorf("--volume %q: use NAME:/path or NAME:/path:ro", v)
		}
		vm := client.VolumeMount{Name: parts[0], Path: parts[1]}
		if len(parts) == 3 {
			switch parts[2] {
			case "ro":
				vm.ReadOnly = true
			case "rw":
			default:
				return fmt.Errorf("--volume %q: the mode must be ro or rw", v)
			}
		}
		req.VolumeMounts = append(req.VolumeMounts, vm)
	}
	return nil
}
