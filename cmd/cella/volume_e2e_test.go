package main

import (
	"strings"
	"testing"
)

// TestCLIVolumesAndLifecycle drives `cella volume`, `--volume` and the
// lifecycle flags against a real `cella serve` with a daemon default policy.
func TestCLIVolumesAndLifecycle(t *testing.T) {
	t.Setenv("CELLA_AUTO_ARCHIVE", "1h") // a daemon default, seen in every sandbox
	d := startDaemon(t, t.TempDir(), freePort(t))

	if out := d.mustCella("volume", "create", "vol", "--size", "32M"); out != "vol\n" {
		t.Fatalf("volume create: %q", out)
	}
	if _, errs, code := d.cella("", "volume", "create", "../bad"); code == 0 || !strings.Contains(errs, "invalid volume name") {
		t.Fatalf("bad volume name: exit %d, %q", code, errs)
	}
	d.mustCella("run", "--volume", "vol:/mnt/v", "--", "sh", "-c", "echo hi > /mnt/v/f")
	if out := d.mustCella("run", "--volume", "vol:/mnt/v:ro", "--", "cat", "/mnt/v/f"); out != "hi\n" {
		t.Fatalf("read through a read-only mount: %q", out)
	}
	if _, _, code := d.cella("", "run", "--volume", "vol:/mnt/v:ro", "--", "sh", "-c", "echo x > /mnt/v/g"); code == 0 {
		t.Fatal("write through a read-only mount succeeded")
	}
	if _, errs, code := d.cella("", "create", "--volume", "vol:relative"); code == 0 || !strings.Contains(errs, "absolute") {
		t.Fatalf("relative mount path: exit %d, %q", code, errs)
	}
	if out := d.mustCella("volume", "ls"); !strings.Contains(out, "vol") || !strings.Contains(out, "32M") {
		t.Fatalf("volume ls: %q", out)
	}

	id := strings.TrimSpace(d.mustCella("create", "--auto-stop", "10m", "--auto-delete", "2d", "--auto-resume", "--volume", "vol:/v"))
	info := d.mustCella("info", id)
	for _, want := range []string{`"autoStopSeconds": 600`, `"autoArchiveSeconds": 3600`, `"autoDeleteSeconds": 172800`,
		`"autoResume": true`, `"nextTransition": {`, `"action": "kill"`, `"path": "/v"`} {
		if !strings.Contains(info, want) {
			t.Fatalf("cella info lacks %s:\n%s", want, info)
		}
	}
	if _, errs, code := d.cella("", "volume", "rm", "vol"); code == 0 || !strings.Contains(errs, "in use") {
		t.Fatalf("rm of a volume in use: exit %d, %q", code, errs)
	}
	d.mustCella("kill", id)
	d.mustCella("volume", "rm", "vol")
	if out := d.mustCella("volume", "ls", "--json"); strings.Contains(out, `"vol"`) {
		t.Fatalf("volume still listed: %s", out)
	}
}
