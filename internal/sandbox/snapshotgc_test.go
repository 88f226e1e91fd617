package sandbox

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/template"
)

// TestGCSnapshotsLeavesOnesBeingMade: a snapshot collection (which any
// sandbox's kill runs) removes snapshot directories no record names — but
// not that of a snapshot still being made, whose record is written last:
// it once took one from under a snapshot taken while another sandbox was
// being killed (the snapshot failed, or was recorded without its files).
func TestGCSnapshotsLeavesOnesBeingMade(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "cella.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tpls, err := template.NewStore(filepath.Join(dir, "cache"))
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{cfg: Config{DataDir: dir, Store: st, Templates: tpls}, log: slog.New(slog.DiscardHandler)}
	making, orphan := m.snapshotDir("making"), m.snapshotDir("orphan")
	for _, d := range []string{making, orphan} {
		if err := os.MkdirAll(filepath.Join(d, "layer"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(d string) bool { _, err := os.Stat(d); return err == nil }

	m.makingSnapshot("making", true)
	m.gcSnapshots(context.Background())
	if !exists(making) {
		t.Error("the collection removed the directory of a snapshot being made")
	}
	if exists(orphan) {
		t.Error("the collection left a directory no record names")
	}
	m.makingSnapshot("making", false)
	m.gcSnapshots(context.Background())
	if exists(making) {
		t.Error("a snapshot given up on (no record, no longer being made) was left")
	}
}
