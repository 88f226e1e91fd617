package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/template"
)

// templateRows parses `cella template ls` into its rows by NAME.
func templateRows(t *testing.T, out string) map[string][]string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "NAME  ") || !strings.Contains(lines[0], "CACHE NAME") {
		t.Fatalf("template ls header: %q", out)
	}
	// Columns are separated by at least two spaces; SOURCE holds single ones.
	rows := map[string][]string{}
	for _, l := range lines[1:] {
		var cols []string
		for _, c := range strings.Split(l, "  ") {
			if c = strings.TrimSpace(c); c != "" {
				cols = append(cols, c)
			}
		}
		rows[cols[0]] = cols
	}
	return rows
}

// TestCLITemplateNames: `cella template ls` and `rm` speak of templates by
// the names users know — an API template's alias, a machine template's
// name — with each one's cache name in a column; rm takes the alias, the
// ID or the cache name, and refuses, naming what holds it, a template a
// running sandbox or a warm pool uses, and a machine template for a key
// that is not the admin's.
func TestCLITemplateNames(t *testing.T) {
	d := startDaemon(t, t.TempDir(), freePort(t))
	run := fmt.Sprint(time.Now().UnixNano())
	// A machine template: another name of base's image (nothing copied).
	tpls, err := template.NewStore(daemontest.CacheDir())
	if err != nil {
		t.Fatal(err)
	}
	base, err := tpls.Get("base")
	if err != nil {
		t.Fatal(err)
	}
	machine := "cli-names-" + run
	if _, err := tpls.Name(machine, base.Image, "", nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tpls.Delete(machine) })
	// An API template, built by the daemon from the CLI.
	alias := "cli-alias-" + run
	d.mustCella("template", "build", alias, "--run", "echo "+run+" > /home/user/run")
	t.Cleanup(func() { // even after a failed check: the cache is shared
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if _, errs, code := d.cella("", "template", "rm", alias); code == 0 || strings.Contains(errs, "not found") {
				return
			}
		}
	})

	rows := templateRows(t, d.mustCella("template", "ls"))
	api, ok := rows[alias]
	if !ok {
		t.Fatalf("the alias %s is not a row: %v", alias, rows)
	}
	id, cacheName := api[1], api[2]
	if len(id) != 20 || cacheName != "e2b."+id+"."+strings.Split(cacheName, ".")[2] || !strings.HasPrefix(cacheName, "e2b."+id+".") {
		t.Fatalf("API template row %q", api)
	}
	if _, err := tpls.Get(cacheName); err != nil {
		t.Fatalf("the cache name %s is not in the cache: %v", cacheName, err)
	}
	if r := rows[machine]; len(r) < 3 || r[1] != "-" || r[2] != machine {
		t.Fatalf("machine template row %q", r)
	}
	if r := rows["base"]; len(r) < 6 || r[2] != "base" || r[5] != "1" {
		t.Fatalf("base row %q", r)
	}
	for name := range rows {
		if strings.HasPrefix(name, "e2b.") {
			t.Fatalf("a cache name is listed as a name: %v", rows)
		}
	}
	var list []struct {
		TemplateID string   `json:"templateID"`
		Aliases    []string `json:"aliases"`
		StoreName  string   `json:"storeName"`
		LayerCount int      `json:"layerCount"`
	}
	if err := json.Unmarshal([]byte(d.mustCella("template", "ls", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range list {
		found = found || (l.TemplateID == id && l.StoreName == cacheName && l.LayerCount == len(mustGet(t, tpls, cacheName).Lowers()))
	}
	if !found {
		t.Fatalf("ls --json: %+v", list)
	}

	// In use by a running sandbox: refused, naming it (both kinds).
	for _, name := range []string{alias, machine} {
		sb := strings.TrimSpace(d.mustCella("create", "--template", name, "--timeout", "5m"))
		out, errs, code := d.cella("", "template", "rm", name)
		if code == 0 || !strings.Contains(errs, sb) || !strings.Contains(errs, "kill them first") {
			t.Fatalf("rm %s while sandbox %s runs: exit %d %s%s", name, sb, code, out, errs)
		}
		d.mustCella("kill", sb)
	}
	// A key that is not the admin's sees machine templates but may not remove them.
	key := strings.TrimSpace(d.mustCella("key", "create", "cli-names"))
	if out, errs, code := d.cellaWith(key, "", "template", "rm", machine); code == 0 || !strings.Contains(errs, "only the admin key") {
		t.Fatalf("rm of a machine template by a team key: exit %d %s%s", code, out, errs)
	}
	// In use by a warm pool: refused, naming the pool. Once the pool is set
	// to 0 (its fill in flight at that moment included) the template goes
	// at once: the API template by its cache name, the machine one by name.
	for _, pooled := range []struct{ rm, storeName string }{{cacheName, cacheName}, {machine, machine}} {
		d.mustCella("pool", "set", pooled.storeName, "--size", "1")
		out, errs, code := d.cella("", "template", "rm", pooled.rm)
		if code == 0 || !strings.Contains(errs, "warm pool") || !strings.Contains(errs, "cella pool set "+pooled.storeName+" --size 0") {
			t.Fatalf("rm %s with a pool: exit %d %s%s", pooled.rm, code, out, errs)
		}
		d.mustCella("pool", "set", pooled.storeName, "--size", "0")
		d.mustCella("template", "rm", pooled.rm)
	}
	rows = templateRows(t, d.mustCella("template", "ls"))
	if _, ok := rows[alias]; ok {
		t.Fatalf("%s still listed", alias)
	}
	if _, ok := rows[machine]; ok {
		t.Fatalf("%s still listed", machine)
	}
	if _, err := tpls.Get(machine); err == nil {
		t.Fatalf("%s is still in the cache", machine)
	}
	if _, errs, code := d.cella("", "template", "rm", alias); code == 0 || !strings.Contains(errs, "not found") {
		t.Fatalf("a second rm: exit %d %s", code, errs)
	}
	// --local does not touch an API template's build behind the daemon's back.
	if _, errs, code := d.cella("", "template", "rm", "--local", "e2b.x.y"); code == 0 || !strings.Contains(errs, "through the daemon") {
		t.Fatalf("rm --local of a cache name of a build: exit %d %s", code, errs)
	}
}

func mustGet(t *testing.T, s *template.Store, name string) *template.Template {
	t.Helper()
	tpl, err := s.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}
