package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/runtime"
)

// idleFloor is what an idle container of the runtime costs with no cella
// in it: the runtime's own processes (gVisor's sentry and gofer, or crun's
// container) running /bin/sleep on the same root, each in a memory cgroup
// of its own, read the same way as a sandbox's.
type idleFloor struct {
	N            int
	PSS, Charged int64 // each, bytes
}

// rawIdleFloor starts n detached raw containers of rt on rootfs (runsc with
// the flags cella's sandboxes run with but no network stack, or crun), lets
// them settle as Density lets its sandboxes settle, and reads their memory.
// The cgroups are this process's own (cella-bench-floor-PID) and are gone
// when it returns.
func rawIdleFloor(ctx context.Context, cfg Config, rt, rootfs string, n int) (idleFloor, error) {
	dir, err := os.MkdirTemp("", "cella-bench-idle-")
	if err != nil {
		return idleFloor{}, err
	}
	defer os.RemoveAll(dir)
	cli, cleanup, err := newRawCLI(cfg, rt, filepath.Join(dir, "state"))
	if err != nil {
		return idleFloor{}, err
	}
	defer cleanup()
	parent := fmt.Sprintf("cella-bench-floor-%d", os.Getpid())
	defer removeCgroupEverywhere(parent)
	// Each container is removed, even one whose run failed part-way: its
	// ID is recorded first.
	var ids []string
	defer func() {
		for _, id := range ids {
			cli.remove(id)
		}
	}()
	for i := range n {
		id := fmt.Sprintf("bench-idle-%s-%d-%d", rt, os.Getpid(), i)
		bundle := filepath.Join(dir, id)
		if err := os.MkdirAll(bundle, 0o700); err != nil {
			return idleFloor{}, err
		}
		if err := rawBundle(bundle, rootfs, "/bin/sleep", "3600"); err != nil {
			return idleFloor{}, err
		}
		if err := setCgroupsPath(filepath.Join(bundle, "config.json"), "/"+parent+"/"+id); err != nil {
			return idleFloor{}, err
		}
		ids = append(ids, id)
		if err := cli.runDetached(ctx, rt, bundle, id); err != nil {
			return idleFloor{}, err
		}
	}
	time.Sleep(2 * time.Second) // as Density: let them settle to idle
	f := idleFloor{N: len(ids)}
	for _, id := range ids {
		cg := filepath.Join("/sys/fs/cgroup/memory", parent, id)
		f.PSS += cgroupPSS(cg)
		f.Charged += cgroupUsage(cg)
	}
	if f.Charged == 0 {
		return f, errors.New("the raw containers' memory cgroups read as empty")
	}
	f.PSS /= int64(len(ids))
	f.Charged /= int64(len(ids))
	return f, nil
}

// setCgroupsPath puts the bundle's container in cgroup path (relative to
// each controller's root).
func setCgroupsPath(configPath, path string) error {
	b, err := os.ReadFile(configPath)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		return err
	}
	linux, _ := spec["linux"].(map[string]any)
	if linux == nil {
		linux = map[string]any{}
		spec["linux"] = linux
	}
	linux["cgroupsPath"] = path
	if b, err = json.Marshal(spec); err != nil {
		return err
	}
	return os.WriteFile(configPath, b, 0o600)
}

// removeCgroupEverywhere removes the (emptied) cgroup name from every v1
// controller the runtimes made it in.
func removeCgroupEverywhere(name string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", name))
	for _, d := range dirs {
		subs, _ := filepath.Glob(filepath.Join(d, "*"))
		for _, s := range subs {
			if fi, err := os.Stat(s); err == nil && fi.IsDir() {
				_ = unix.Rmdir(s)
			}
		}
		_ = unix.Rmdir(d)
	}
}

// floorName names the idle floor of rt's figure.
func floorName(rt string, n int) string {
	if rt == runtime.GVisor {
		return fmt.Sprintf("%d raw idle runsc containers (/bin/sleep, no network stack)", n)
	}
	return fmt.Sprintf("%d raw idle crun containers (/bin/sleep)", n)
}
