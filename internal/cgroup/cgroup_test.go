package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

func TestRemoveKillsAndCleans(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := os.Stat(filepath.Join(Root, "memory")); err != nil {
		t.Skip("no v1 memory hierarchy")
	}
	id := fmt.Sprintf("cgtest-%d", os.Getpid())
	hs, err := hierarchies()
	if err != nil || len(hs) == 0 {
		t.Fatalf("hierarchies: %v %v", hs, err)
	}
	var made []string
	for _, h := range []string{"memory", "pids", "freezer", "cpu"} {
		d := filepath.Join(Root, h, Parent, id)
		if err := os.MkdirAll(filepath.Join(d, "nested"), 0o755); err == nil {
			made = append(made, d)
		}
	}
	t.Cleanup(func() { _ = Remove(id) })
	if len(made) == 0 {
		t.Skip("cannot create cgroups")
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for _, d := range made {
		if err := os.WriteFile(filepath.Join(d, "nested", "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatalf("join %s: %v", d, err)
		}
	}
	// Freeze it: Remove must still be able to kill it.
	fz := filepath.Join(Root, "freezer", Parent, id, "nested", "freezer.state")
	_ = os.WriteFile(fz, []byte("FROZEN"), 0)

	ids, err := List()
	if err != nil || !slices.Contains(ids, id) {
		t.Fatalf("List = %v %v", ids, err)
	}
	pids, err := Pids(id)
	if err != nil || !slices.Equal(pids, []int{cmd.Process.Pid}) {
		t.Fatalf("Pids = %v %v", pids, err)
	}
	if err := Remove(id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("process survived Remove")
	}
	for _, d := range made {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Fatalf("%s still exists", d)
		}
	}
	if ids, _ := List(); slices.Contains(ids, id) {
		t.Fatal("still listed")
	}
	if err := Remove(id); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if _, err := Dirs("../etc"); err == nil {
		t.Fatal("bad id accepted")
	}
}
