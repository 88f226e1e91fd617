package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestUserLookupFollowsFiles: looked-up users are kept while passwd and
// group stay as they were, and an account made, changed or removed inside
// the sandbox is seen by the next lookup, whether the file was replaced
// (useradd's rename) or written in place with the same size.
func TestUserLookupFollowsFiles(t *testing.T) {
	dir := t.TempDir()
	passwd, group := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	write := func(p, data string) {
		t.Helper()
		tmp := p + ".new"
		if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, p); err != nil {
			t.Fatal(err)
		}
	}
	write(passwd, "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/bash\n")
	write(group, "root:x:0:\nalice:x:1000:\nwheel:x:10:alice\n")
	db := newUserDB(passwd, group)

	// Files changed within the racy window are read every time and kept
	// nowhere: another change in the same clock tick could keep the stamp.
	if _, err := db.lookup("alice"); err != nil {
		t.Fatal(err)
	}
	if len(db.cache.users) != 0 {
		t.Fatalf("a user of files changed just now was kept: %v", db.cache.users)
	}
	// From here on every version counts as aged, so that what follows is
	// the cache's own behaviour.
	old := racyWindow
	racyWindow = 0
	t.Cleanup(func() { racyWindow = old })

	u, err := db.lookup("alice")
	if err != nil || u.UID != 1000 || len(u.Groups) != 2 {
		t.Fatalf("alice: %+v %v", u, err)
	}
	u.Groups[0] = 4242 // a caller's change must not reach the cache
	if u, _ := db.lookup("alice"); u.Groups[0] != 1000 {
		t.Fatalf("the cached user was changed through a returned one: %+v", u)
	}
	if _, err := db.lookup("bob"); err == nil {
		t.Fatal("bob before he exists")
	}

	write(passwd, "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/bash\nbob:x:1001:1001::/home/bob:/bin/bash\n")
	if u, err := db.lookup("bob"); err != nil || u.UID != 1001 {
		t.Fatalf("bob after useradd: %+v %v", u, err)
	}

	// In place, same size, one second later: alice's uid 1000 → 1002.
	data := "root:x:0:0:root:/root:/bin/bash\nalice:x:1002:1000::/home/alice:/bin/bash\nbob:x:1001:1001::/home/bob:/bin/bash\n"
	if err := os.WriteFile(passwd, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Second)
	if err := os.Chtimes(passwd, later, later); err != nil {
		t.Fatal(err)
	}
	if u, err := db.lookup("alice"); err != nil || u.UID != 1002 {
		t.Fatalf("alice after an edit in place: %+v %v", u, err)
	}

	write(group, "root:x:0:\nalice:x:1000:\n")
	if u, _ := db.lookup("alice"); len(u.Groups) != 1 {
		t.Fatalf("alice left wheel: %+v", u)
	}
	write(passwd, "root:x:0:0:root:/root:/bin/bash\n")
	if _, err := db.lookup("alice"); err == nil {
		t.Fatal("alice after userdel")
	}
}

// TestRacyStamps: a stamp is racy within racyWindow of its change, and
// within coarseRacyWindow when its ctime is in whole seconds (a file
// system with one-second timestamps, where two changes a few hundred
// milliseconds apart leave the same stamp).
func TestRacyStamps(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	at := func(ago time.Duration, whole bool) fileStamp {
		c := now.Add(-ago).UnixNano()
		if whole {
			c -= c % int64(time.Second)
		} else if c%int64(time.Second) == 0 {
			c-- // not whole
		}
		return fileStamp{ok: true, mtime: c, ctime: c}
	}
	for _, c := range []struct {
		ago   time.Duration
		whole bool
		racy  bool
	}{
		{racyWindow / 2, false, true},
		{racyWindow * 2, false, false},
		{time.Second, true, true},
		{coarseRacyWindow / 2, true, true},
		{coarseRacyWindow * 2, true, false},
	} {
		if got := at(c.ago, c.whole).racy(now); got != c.racy {
			t.Errorf("changed %v ago (whole seconds: %v): racy %v, want %v", c.ago, c.whole, got, c.racy)
		}
	}
}
