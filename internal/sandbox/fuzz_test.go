package sandbox

// Fuzz targets of the create options and volume mounts every create
// request (and every record read back after a restart) goes through. `go
// test` runs the seeds and testdata/fuzz; `go test -run=^$
// -fuzz=FuzzNormalize ./internal/sandbox/` explores.

import (
	"encoding/json"
	"path"
	"reflect"
	"strings"
	"testing"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/volume"
)

// FuzzNormalize: options as JSON (the record's form) normalize, against
// this host's maxima (the daemon's default), to limits within their
// bounds whose host ceilings do not overflow, or fail with InvalidArgument;
// normalized options normalize unchanged and survive their own JSON.
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{
		`{}`,
		`{"template_id":"base","timeout":300000000000,"cpus":2,"memory_mb":1024,"disk_mb":2048,"pids":512,"output_mb":20}`,
		`{"template_id":"../etc","cpus":0.5}`,
		`{"timeout":-1}`, `{"timeout":86400000000001}`,
		`{"cpus":64.000001}`, `{"cpus":1e-300}`, `{"memory_mb":63}`, `{"disk_mb":15}`, `{"pids":15}`,
		`{"memory_mb":9223372036854775807}`, `{"disk_mb":8796093022208}`, `{"pids":9223372036854775807}`,
		`{"output_mb":9223372036854775807}`, `{"memory_mb":8796093022208}`,
		`{"env_vars":{"A":"1","":"x"}}`, `{"env_vars":{"A=B":"x"}}`, `{"env_vars":{"A":"x\u0000y"}}`,
		`{"lifecycle":{"auto_stop":-1}}`, `{"lifecycle":{"auto_delete":315360000000000001}}`,
		`{"metadata":{"k":"v"},"auto_pause":true,"auto_resume":true}`,
	} {
		f.Add([]byte(s))
	}
	max, err := Maxima{}.Resolve(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var o Options
		if json.Unmarshal(data, &o) != nil {
			return
		}
		if err := o.Normalize(max); err != nil {
			if !errdefs.Is(err, errdefs.KindInvalidArgument) {
				t.Fatalf("Normalize(%s) = %v, not InvalidArgument", data, err)
			}
			return
		}
		checkNormalized(t, o, max)
		again := o
		if err := again.Normalize(max); err != nil || !reflect.DeepEqual(again, o) {
			t.Fatalf("normalizing again: %v\n%+v\n%+v", err, o, again)
		}
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatalf("marshal %+v: %v", o, err)
		}
		var back Options
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if err := back.Normalize(max); err != nil {
			t.Fatalf("options read back from %s do not normalize: %v", b, err)
		}
		checkNormalized(t, back, max)
	})
}

func checkNormalized(t *testing.T, o Options, max Maxima) {
	t.Helper()
	switch {
	case !templateNameRe.MatchString(o.TemplateID):
		t.Fatalf("template %q", o.TemplateID)
	case o.Timeout <= 0 || o.Timeout > MaxTimeout:
		t.Fatalf("timeout %v", o.Timeout)
	case !(o.CPUs > 0 && o.CPUs <= max.CPUs):
		t.Fatalf("cpus %v", o.CPUs)
	case o.MemoryMB < 64 || o.MemoryMB > max.MemoryMB, o.DiskMB < 16 || o.DiskMB > max.DiskMB,
		o.Pids < 16 || o.Pids > max.Pids, o.OutputMB < 1 || o.OutputMB > MaxOutputMB:
		t.Fatalf("limits out of bounds: %v output=%d", o, o.OutputMB)
	}
	if err := o.Lifecycle.Validate(); err != nil {
		t.Fatalf("lifecycle %+v: %v", o.Lifecycle, err)
	}
	// The host ceilings of both runtimes and the agent's byte limits.
	for _, rt := range []string{runtime.GVisor, runtime.Namespaces} {
		m := &Manager{cfg: Config{Runtime: namedRuntime{name: rt}}}
		l := m.ceilings(o)
		if l.MemoryBytes < mib(o.MemoryMB) || l.Pids < o.Pids || l.CPUs != o.CPUs {
			t.Fatalf("%s ceilings %+v below the limits of %v (overflow?)", rt, l, o)
		}
	}
	if mib(o.DiskMB) <= 0 || mib(o.OutputMB) <= 0 {
		t.Fatalf("disk or output bytes overflow: %v", o)
	}
	for k, v := range o.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			t.Fatalf("env var %q=%q cannot be passed to execve", k, v)
		}
	}
}

// namedRuntime is enough of a runtime for Manager.ceilings, which only
// asks its name.
type namedRuntime struct {
	runtime.Runtime
	name string
}

func (n namedRuntime) Name() string { return n.name }

// FuzzValidateVolumeMounts: accepted mounts have valid volume names and
// absolute, clean, distinct paths that neither cover nor sit under what
// cella mounts itself, and that stay under any root they are joined to.
func FuzzValidateVolumeMounts(f *testing.F) {
	for _, s := range [][4]string{
		{"data", "/mnt/data", "cache", "/home/user/.cache"},
		{"data", "/", "", ""}, {"data", "/proc/x", "", ""}, {"data", "/run", "", ""}, {"data", "/run/cella", "", ""},
		{"data", "/.cella/x", "", ""}, {"data", "/mnt/../etc", "", ""}, {"data", "/mnt//x", "", ""}, {"data", "/mnt/", "", ""},
		{"data", "mnt", "", ""}, {"data", "/a,b", "", ""}, {"data", "/a:b", "", ""}, {"data", "/a\nb", "", ""},
		{"../x", "/mnt", "", ""}, {"data", "/mnt", "data2", "/mnt"}, {"data", "/devices", "", ""}, {"data", "/dev", "", ""},
		{"data", "/sys/fs", "", ""}, {"data", "/runner", "", ""}, {"-bad", "/mnt", "", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3], false)
	}
	f.Fuzz(func(t *testing.T, n1, p1, n2, p2 string, ro bool) {
		vms := []VolumeMount{{Name: n1, Path: p1, ReadOnly: ro}}
		if n2 != "" || p2 != "" {
			vms = append(vms, VolumeMount{Name: n2, Path: p2})
		}
		err := ValidateVolumeMounts(vms)
		if err != nil {
			if !errdefs.Is(err, errdefs.KindInvalidArgument) {
				t.Fatalf("ValidateVolumeMounts(%+v) = %v, not InvalidArgument", vms, err)
			}
			return
		}
		seen := map[string]bool{}
		for _, vm := range vms {
			if volume.ValidateName(vm.Name) != nil {
				t.Fatalf("accepted volume name %q", vm.Name)
			}
			p := vm.Path
			if !path.IsAbs(p) || path.Clean(p) != p || p == "/" || strings.ContainsAny(p, "\x00,:\n") {
				t.Fatalf("accepted mount path %q", p)
			}
			if seen[p] {
				t.Fatalf("path %q accepted twice", p)
			}
			seen[p] = true
			for _, f := range forbiddenMountRoots {
				if p == f || strings.HasPrefix(p, f+"/") || strings.HasPrefix(f, p+"/") {
					t.Fatalf("mount path %q covers or sits under %s", p, f)
				}
			}
			if j := path.Join("/guest/root", p); !strings.HasPrefix(j, "/guest/root/") {
				t.Fatalf("mount path %q leaves a root it is joined to: %s", p, j)
			}
		}
	})
}
