package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// cellaAs runs the CLI with another key than the admin's.
func (d *daemonProc) cellaAs(key string, args ...string) (string, string, int) {
	d.t.Helper()
	return d.cellaWith(key, "", args...)
}

// TestKeyQuotaCLI: `cella key create/update` set a key's quota; a key at
// its limit of running sandboxes is refused with the limit and the command
// that raises it; after a crash of the daemon (kill -9) the next daemon
// adopts the running sandboxes and the key is still at its limit — what a
// key holds is counted from the sandboxes that exist, not from a counter
// that a restart resets.
func TestKeyQuotaCLI(t *testing.T) {
	dataDir := t.TempDir()
	listen := freePort(t)
	d := startDaemon(t, dataDir, listen, "--runtime", "namespaces")
	key := strings.TrimSpace(d.mustCella("key", "create", "ci", "--max-sandboxes", "2", "--max-memory", "2G", "--create-rate", "100/m", "--request-rate", "50/s"))
	var self struct {
		MaxSandboxes int    `json:"maxSandboxes"`
		MaxMemoryMB  int64  `json:"maxMemoryMB"`
		CreateRate   string `json:"createRate"`
		RequestRate  string `json:"requestRate"`
		Usage        struct {
			Sandboxes int `json:"sandboxes"`
		} `json:"usage"`
	}
	ids := []string{}
	for range 2 {
		out, errs, code := d.cellaAs(key, "create", "--timeout", "10m")
		if code != 0 {
			t.Fatalf("create within the limit: exit %d %s", code, errs)
		}
		ids = append(ids, strings.TrimSpace(out))
	}
	refused := func(d *daemonProc, limit string) {
		t.Helper()
		_, errs, code := d.cellaAs(key, "create", "--timeout", "10m")
		if code == 0 || !strings.Contains(errs, "limit of "+limit+" running sandboxes (maxSandboxes") || !strings.Contains(errs, "cella key update ci --max-sandboxes N") {
			t.Fatalf("a create past maxSandboxes %s: exit %d, stderr %q", limit, code, errs)
		}
	}
	refused(d, "2")

	d.kill9()
	d2 := startDaemon(t, dataDir, listen, "--runtime", "namespaces")
	t.Cleanup(func() {
		for _, id := range ids {
			d2.cella("", "kill", id)
		}
	})
	for _, id := range ids {
		if out := d2.mustCella("info", id); !strings.Contains(out, "running") {
			t.Fatalf("sandbox %s after the crash: %s", id, out)
		}
	}
	refused(d2, "2")
	out := d2.mustCella("key", "update", "ci", "--max-sandboxes", "3")
	if !strings.Contains(out, "3 sandboxes") || !strings.Contains(out, "2048 MiB") || !strings.Contains(out, "creates 100/m") {
		t.Fatalf("cella key update: %q", out)
	}
	out, errs, code := d2.cellaAs(key, "create", "--timeout", "10m")
	if code != 0 {
		t.Fatalf("create after raising the limit: exit %d %s", code, errs)
	}
	ids = append(ids, strings.TrimSpace(out))
	refused(d2, "3")
	// GET /keys/self shows the quota and what the key holds.
	req, _ := http.NewRequest("GET", d2.url+"/keys/self", nil)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := json.Unmarshal(res, &self); err != nil {
		t.Fatal(err)
	}
	if self.MaxSandboxes != 3 || self.MaxMemoryMB != 2048 || self.CreateRate != "100/m" || self.RequestRate != "50/s" || self.Usage.Sandboxes != 3 {
		t.Fatalf("GET /keys/self: %s", res)
	}
	if _, errs, code := d2.cella("", "key", "update", "ci"); code == 0 || !strings.Contains(errs, "nothing to change") {
		t.Fatalf("cella key update without a flag: exit %d %q", code, errs)
	}
}
