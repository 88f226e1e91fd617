package sandbox

import (
	"math"
	"strings"
	"testing"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/template"
)

// testMaxima are fixed, so that no test depends on the host's cores or RAM.
var testMaxima = Maxima{CPUs: 4, MemoryMB: 8192, DiskMB: 8192, Pids: 4096}

// TestNormalizeMaxima: a limit above the operator's maximum is an invalid
// argument naming the limit, the maximum and the flag that sets it; at the
// maximum it is accepted.
func TestNormalizeMaxima(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{MemoryMB: 10 << 20}, "memory 10485760 MiB is above this daemon's maximum of 8192 MiB (cella serve --max-memory)"},
		{Options{DiskMB: 96 << 20}, "disk 100663296 MiB is above this daemon's maximum of 8192 MiB (cella serve --max-disk)"},
		{Options{Pids: 4 << 20}, "pids 4194304 is above this daemon's maximum of 4096 (cella serve --max-pids)"},
		{Options{CPUs: 64}, "cpus 64 is above this daemon's maximum of 4 (cella serve --max-cpus)"},
		{Options{CPUs: math.Inf(1)}, "cpus +Inf is above this daemon's maximum of 4 (cella serve --max-cpus)"},
		{Options{CPUs: math.NaN()}, "must not be negative"},
		{Options{OutputMB: 1 << 50}, "output limit 1125899906842624 MiB is above the maximum of 1024 MiB"},
		{Options{MemoryMB: 1 << 62}, "above this daemon's maximum"}, // mib() of it would wrap
	} {
		err := c.o.Normalize(testMaxima)
		if err == nil || !errdefs.Is(err, errdefs.KindInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v; want an invalid argument saying %q", c.o, err, c.want)
		}
	}
	at := Options{CPUs: 4, MemoryMB: 8192, DiskMB: 8192, Pids: 4096, OutputMB: MaxOutputMB}
	if err := at.Normalize(testMaxima); err != nil {
		t.Fatalf("limits at the maxima: %v", err)
	}
}

// TestResolveMaxima: unset maxima are the host's (disk: no more than the
// data dir's free space); a maximum below the
// default of its limit is refused (a create asking for nothing, and every
// warm pool's sandbox, would fail).
func TestResolveMaxima(t *testing.T) {
	dir := t.TempDir()
	host := HostMaxima(dir)
	if ram := HostMaxima(""); host.CPUs < 1 || ram.MemoryMB < 1024 || host.MemoryMB != ram.MemoryMB || ram.DiskMB != ram.MemoryMB ||
		host.DiskMB > ram.DiskMB || host.DiskMB < 1 || host.Pids != DefaultMaxPids {
		t.Fatalf("host maxima %+v (without a data dir %+v)", host, ram)
	}
	m, err := Maxima{MemoryMB: 2048}.Resolve(dir)
	if err != nil || m.MemoryMB != 2048 || m.CPUs != host.CPUs || m.DiskMB != host.DiskMB || m.Pids != host.Pids {
		t.Fatalf("resolve: %+v %v", m, err)
	}
	for m, want := range map[Maxima]string{
		{CPUs: 0.5}:     "--max-cpus 0.5 is below the default sandbox CPUs of 1",
		{MemoryMB: 256}: "--max-memory 256 MiB is below the default sandbox memory of 512 MiB",
		{DiskMB: 512}:   "--max-disk 512 MiB is below the default sandbox disk of 1024 MiB",
		{Pids: 100}:     "--max-pids 100 is below the default sandbox pids limit of 256",
		// A maximum whose host ceiling would overflow (--max-memory 8E).
		{MemoryMB: 1 << 43}: "--max-memory 8796093022208 MiB is above the most cella can enforce, 1073741824 MiB",
		{DiskMB: 1 << 43}:   "--max-disk 8796093022208 MiB is above the most cella can enforce, 1073741824 MiB",
		{Pids: 1 << 40}:     "--max-pids 1099511627776 is above the most cella can enforce, 4194304 (the kernel's PID_MAX_LIMIT)",
		{CPUs: 1e9}:         "--max-cpus 1e+09 is above the most cella can enforce, 4096",
	} {
		if _, err := m.Resolve(dir); err == nil || err.Error() != want {
			t.Errorf("%+v: %v; want %q", m, err, want)
		}
	}
}

// TestNormalizeTemplateDefaults: a create of the docker template (or a
// build step on it) that names no memory or disk gets the template's; what
// a create names wins; a default above the daemon's maximum is refused
// naming the template and the flag; other templates get the daemon's.
func TestNormalizeTemplateDefaults(t *testing.T) {
	for _, c := range []struct {
		o            Options
		memory, disk int64
	}{
		{Options{TemplateID: "docker"}, template.DockerMemoryMB, template.DockerDiskMB},
		{Options{TemplateID: "built-on-docker", Image: "r-x", Services: []string{template.ServiceDocker}}, template.DockerMemoryMB, template.DockerDiskMB},
		{Options{TemplateID: "docker", MemoryMB: 700, DiskMB: 900}, 700, 900},
		{Options{}, DefaultMemoryMB, DefaultDiskMB},
		{Options{TemplateID: "code-interpreter-v1"}, DefaultMemoryMB, DefaultDiskMB},
	} {
		o := c.o
		if err := o.Normalize(testMaxima); err != nil {
			t.Fatalf("%+v: %v", c.o, err)
		}
		if o.MemoryMB != c.memory || o.DiskMB != c.disk {
			t.Errorf("%+v: memory %d disk %d, want %d %d", c.o, o.MemoryMB, o.DiskMB, c.memory, c.disk)
		}
	}
	small := Maxima{CPUs: 4, MemoryMB: 8192, DiskMB: 3000, Pids: 4096}
	o := Options{TemplateID: "docker"}
	if err := o.Normalize(small); err == nil || !errdefs.Is(err, errdefs.KindInvalidArgument) || !strings.Contains(err.Error(), "the docker template's default disk of 4096 MiB is above this daemon's maximum of 3000 MiB (raise cella serve --max-disk") {
		t.Errorf("docker default disk above the maximum: %v", err)
	}
}

// A builtin template with a memory default of its own (the desktop) gets
// it when the create asks for none; an explicit limit wins; a default above
// the daemon's maximum is refused naming the template and the flag.
func TestNormalizeTemplateMemory(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want int64
	}{
		{Options{TemplateID: template.DesktopName}, template.DesktopMemoryMB},
		{Options{TemplateID: template.DesktopName, MemoryMB: 1024}, 1024},
		{Options{}, DefaultMemoryMB},
		{Options{TemplateID: template.CodeInterpreterName}, DefaultMemoryMB},
	} {
		o := c.o
		if err := o.Normalize(testMaxima); err != nil || o.MemoryMB != c.want {
			t.Errorf("%+v: memory %d MiB, %v; want %d MiB", c.o, o.MemoryMB, err, c.want)
		}
	}
	small := testMaxima
	small.MemoryMB = 1024
	o := Options{TemplateID: template.DesktopName}
	if err := o.Normalize(small); err == nil || !errdefs.Is(err, errdefs.KindInvalidArgument) || !strings.Contains(err.Error(), "the desktop template's default memory of 2048 MiB is above this daemon's maximum of 1024 MiB (raise cella serve --max-memory") {
		t.Errorf("desktop default above the maximum: %v", err)
	}
}
