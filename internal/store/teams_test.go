package store

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestTeams: a key without a team gets one of its own, named after it (a
// taken name gets a suffix); a key naming a team joins it, making it if
// needed; the admin key is in the admin team.
func TestTeams(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "cella.db"))
	if err := st.AddAPIKey(ctx, AdminKeyID, "admin", "e2b_admin"); err != nil {
		t.Fatal(err)
	}
	a, _, err := st.CreateAPIKey(ctx, NewKey{Name: "CI.Bot"})
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := st.CreateAPIKey(ctx, NewKey{Name: "ci.bot"})
	if err != nil {
		t.Fatal(err)
	}
	if a.TeamName != "ci.bot" || b.TeamName != "ci.bot-2" || a.TeamID == b.TeamID {
		t.Fatalf("own teams: %+v, %+v", a, b)
	}
	c, ckey, err := st.CreateAPIKey(ctx, NewKey{Name: "c", Team: "research", Secrets: []string{"GH"}})
	if err != nil {
		t.Fatal(err)
	}
	d, _, err := st.CreateAPIKey(ctx, NewKey{Name: "d", Team: "research"})
	if err != nil {
		t.Fatal(err)
	}
	if c.TeamID != d.TeamID || c.TeamName != "research" {
		t.Fatalf("shared team: %+v, %+v", c, d)
	}
	got, err := st.LookupAPIKey(ctx, ckey)
	if err != nil || got.TeamID != c.TeamID || got.TeamName != "research" || len(got.Secrets) != 1 || got.Secrets[0] != "GH" {
		t.Fatalf("looked up %+v %v", got, err)
	}
	admin, err := st.LookupAPIKey(ctx, "e2b_admin")
	if err != nil || admin.TeamID != AdminTeamID || admin.TeamName != "admin" {
		t.Fatalf("admin key: %+v %v", admin, err)
	}
	if _, _, err := st.CreateAPIKey(ctx, NewKey{Name: "e", Team: "Bad Name"}); err == nil {
		t.Fatal("a team name with a space was accepted")
	}
	teams, err := st.ListTeams(ctx)
	if err != nil || len(teams) != 4 {
		t.Fatalf("teams: %+v %v", teams, err)
	}
}

// TestMigrateTeams: a database of a cella without teams — keys, a sandbox
// and a snapshot of a key, one of a deleted key, a volume keyed by its name
// — gets a team per key, the sandbox and snapshot their key's team (the
// admin's for the deleted key), the volume its name as ID in the admin
// team, and an owner row per sandbox.
func TestMigrateTeams(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "cella.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	// The schema as the last cella without teams made it: every migration
	// before "teams" (later ones may follow it).
	before := slices.IndexFunc(migrations, func(m migration) bool { return m.name == "teams" })
	for _, m := range migrations[:before] {
		tx, _ := db.Begin()
		if err := m.run(ctx, tx); err != nil {
			t.Fatal(err)
		}
		tx.Commit()
	}
	if _, err := db.Exec(`
INSERT INTO api_keys(id,name,hash,created_at) VALUES('admin','admin','h0',1), ('k1','alice','h1',2);
INSERT INTO sandboxes(id,template_id,runtime,state,started_at,end_at,api_key_id,record) VALUES
	('sa','base','gvisor','running',1000,2000,'k1','{}'), ('sb','base','gvisor','paused',1000,2000,'kgone','{}');
INSERT INTO snapshots(id,sandbox_id,template_id,created_at,api_key_id,record) VALUES('sn','sa','base',1,'k1','{}');
INSERT INTO volumes(name,size_bytes,created_at) VALUES('data',1048576,5);`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	st := openTest(t, path)
	keys, err := st.ListAPIKeys(ctx)
	if err != nil || len(keys) != 2 {
		t.Fatalf("keys: %+v %v", keys, err)
	}
	alice := keys[1]
	if keys[0].TeamID != AdminTeamID || alice.TeamName != "alice" || alice.TeamID == AdminTeamID {
		t.Fatalf("teams of keys: %+v", keys)
	}
	for id, want := range map[string]string{"sa": alice.TeamID, "sb": AdminTeamID} {
		sb, err := st.GetSandbox(ctx, id)
		if err != nil || sb.TeamID != want {
			t.Fatalf("sandbox %s: team %q, want %q (%v)", id, sb.TeamID, want, err)
		}
		team, _, err := st.SandboxOwner(ctx, id)
		if err != nil || team != want {
			t.Fatalf("owner of %s: %q, want %q (%v)", id, team, want, err)
		}
	}
	if sn, err := st.GetSnapshot(ctx, "", "sn"); err != nil || sn.TeamID != alice.TeamID {
		t.Fatalf("snapshot: %+v %v", sn, err)
	}
	v, err := st.GetVolume(ctx, AdminTeamID, "data")
	if err != nil || v.ID != "data" || v.SizeBytes != 1048576 || !v.CreatedAt.Equal(time.UnixMilli(5)) {
		t.Fatalf("volume: %+v %v", v, err)
	}
	if _, err := st.GetVolume(ctx, alice.TeamID, "data"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the admin team's volume is found in alice's: %v", err)
	}
	// Names are per team: alice may have a "data" of her own.
	if err := st.PutVolume(ctx, Volume{ID: "vol_1", Name: "data", TeamID: alice.TeamID, SizeBytes: 1, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutVolume(ctx, Volume{ID: "vol_2", Name: "data", TeamID: alice.TeamID, SizeBytes: 1, CreatedAt: time.Now()}); !errors.Is(err, ErrExists) {
		t.Fatalf("a second data volume in one team: %v", err)
	}
	// Opening again changes nothing.
	st.Close()
	st2 := openTest(t, path)
	if again, err := st2.ListAPIKeys(ctx); err != nil || len(again) != 2 || again[1].TeamID != alice.TeamID {
		t.Fatalf("reopened: %+v %v", again, err)
	}
}

// TestSchemaNewerThanCella: a database migrated by a newer cella is refused
// with a message that says so, not misread.
func TestSchemaNewerThanCella(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cella.db")
	openTest(t, path).Close()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`PRAGMA user_version = 999`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := Open(path); err == nil {
		t.Fatal("a database of a newer schema was opened")
	}
}
