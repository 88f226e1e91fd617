package main

import (
	"fmt"
	"math"
	"os"
	"strconv"

	"github.com/spf13/pflag"

	"github.com/cella-sandbox/cella/internal/sandbox"
)

// registerMaxFlags adds cella serve's maxima of sandbox limits, each also
// read from its CELLA_MAX_* variable. 0 (the default) is the host's value
// (sandbox.HostMaxima). A bad environment value is returned, so that serve
// refuses to start rather than run without the bound the operator set.
func registerMaxFlags(fs *pflag.FlagSet, m *sandbox.Maxima) error {
	var errs []error
	env := func(name string, set func(string) error) {
		if v := os.Getenv(name); v != "" {
			if err := set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
		}
	}
	cpus := maxCPUs{&m.CPUs}
	mem, disk := maxMiB{&m.MemoryMB}, maxMiB{&m.DiskMB}
	pids := maxPids{&m.Pids}
	env("CELLA_MAX_CPUS", cpus.Set)
	env("CELLA_MAX_MEMORY", mem.Set)
	env("CELLA_MAX_DISK", disk.Set)
	env("CELLA_MAX_PIDS", pids.Set)
	fs.Var(cpus, "max-cpus", "most CPUs a sandbox may ask for; 0 = the host's cores [CELLA_MAX_CPUS]")
	fs.Var(mem, "max-memory", "most memory a sandbox may ask for, e.g. 16G; 0 = the host's RAM [CELLA_MAX_MEMORY]")
	fs.Var(disk, "max-disk", "largest writable layer a sandbox may ask for, e.g. 8G (a tmpfs: it fills host RAM); 0 = the host's RAM [CELLA_MAX_DISK]")
	fs.Var(pids, "max-pids", fmt.Sprintf("most processes a sandbox may ask for; 0 = %d [CELLA_MAX_PIDS]", sandbox.DefaultMaxPids))
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// maxCPUs, maxMiB and maxPids are the pflag.Values of the maxima.
type maxCPUs struct{ v *float64 }

func (f maxCPUs) String() string { return strconv.FormatFloat(*f.v, 'g', -1, 64) }
func (f maxCPUs) Type() string   { return "cpus" }
func (f maxCPUs) Set(s string) error {
	n, err := strconv.ParseFloat(s, 64)
	if err != nil || n < 0 || math.IsNaN(n) || math.IsInf(n, 0) {
		return fmt.Errorf("invalid CPU count %q (use e.g. 8 or 0.5; 0 = the host's cores)", s)
	}
	*f.v = n
	return nil
}

type maxMiB struct{ v *int64 }

func (f maxMiB) String() string {
	if *f.v == 0 {
		return "0"
	}
	return strconv.FormatInt(*f.v, 10) + "M"
}
func (f maxMiB) Type() string { return "size" }
func (f maxMiB) Set(s string) error {
	if s == "0" {
		*f.v = 0
		return nil
	}
	n, err := parseMiB(s)
	if err != nil {
		return err
	}
	*f.v = n
	return nil
}

type maxPids struct{ v *int64 }

func (f maxPids) String() string { return strconv.FormatInt(*f.v, 10) }
func (f maxPids) Type() string   { return "int" }
func (f maxPids) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return fmt.Errorf("invalid process count %q", s)
	}
	*f.v = n
	return nil
}
