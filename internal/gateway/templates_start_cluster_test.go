package gateway_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
)

// TestClusterTemplateStartAndTags: a template pulled by a node is the
// template its builder has (issue 14), on a cluster of two nodes and two
// gateways (real API server, real `cella serve` processes, Debian's
// docker-registry as the cluster's template registry, the real E2B SDK).
//   - Two builds through gateway 1, each with setStartCmd (a python
//     http.server serving a word of its own) and a ready command: the
//     first as the alias, the second as alias:v2. The record names the
//     first as the current build and v2's build with its own digest.
//   - With the builder drained, creates of the alias and of alias:v2
//     through gateway 2 land on the other node, which pulls each build,
//     runs its start command once for its own snapshot, and the
//     sandboxes' servers answer with their build's word, as on the
//     builder; a second create pulls and captures nothing again.
//   - The SDK's assignTags (alias:v2 → prod) through gateway 2 and
//     removeTags through gateway 1 change the record (another team's
//     assign is a 404 and changes nothing); alias:prod then resolves to
//     v2's build on the pulling node, and after the remove is a 404 there.
//   - A build whose start command fetches from capture.test (in the
//     nodes' egress ceiling, on this host's loopback) reaches it on its
//     builder; on the node that pulls it the start command runs with no
//     egress, so the create there is a 503 naming the start command, the
//     next create fails at once, and capture.test saw the builder only.
//   - A build on code-interpreter-v1 records its service; on the node that
//     did not build it its sandbox's code interpreter runs a cell.
func TestClusterTemplateStartAndTags(t *testing.T) {
	tc := startTemplateCluster(t, "cella-tpl-start")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	newClient := func(url, key string) *client.Client { return tc.client(t, url, key) }
	keyA, keyB := tc.keyOf(ctx, t, "team-a"), tc.keyOf(ctx, t, "team-b")
	a2 := newClient(tc.gw2.URL, keyA)
	var sandboxes []string
	var built, builtCI, builtNet string
	t.Cleanup(func() { // the template cache is this host's, shared with other tests
		for _, id := range sandboxes {
			_ = newClient(tc.gw2.URL, tc.admin).Kill(context.Background(), id)
		}
		for _, n := range []*clustertest.Proc{tc.nodeA, tc.nodeB} {
			for _, id := range []string{built, builtCI, builtNet} {
				if id != "" {
					_ = newClient(n.URL, tc.admin).DeleteTemplate(context.Background(), id)
				}
			}
		}
	})

	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	alias := "cluster-start-" + hex.EncodeToString(suffix)
	serving := func(word string) []string {
		return []string{
			"CELLA_BUILD_RUN=mkdir -p /home/user/www && echo " + word + " > /home/user/www/index.html",
			"CELLA_BUILD_START_CMD=python3 -m http.server 8000 --directory /home/user/www",
			"CELLA_BUILD_READY_CMD=curl -sf http://127.0.0.1:8000/ >/dev/null",
		}
	}
	first := sdkBuild(t, tc.gw1.URL, keyA, alias, serving("served-by-the-first-build")...)
	built = first.TemplateID
	second := sdkBuild(t, tc.gw1.URL, keyA, alias+":v2", serving("served-by-v2")...)
	if second.TemplateID != first.TemplateID || second.BuildID == first.BuildID {
		t.Fatalf("alias:v2 built %+v; want a new build of %s", second, first.TemplateID)
	}
	id := first.TemplateID
	rec, err := tc.records.Template(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("record: %+v", rec.Spec)
	v2, ok := rec.Spec.Tag("v2")
	if rec.Spec.Build != first.BuildID || !ok || v2.Build != second.BuildID || !strings.HasPrefix(v2.Digest, "sha256:") ||
		v2.Digest == rec.Spec.Digest || v2.Reference != tc.prefix+"/"+id+":"+second.BuildID || v2.CPUCount != 1 || v2.MemoryMB != 768 {
		t.Errorf("record %+v: want the current build %s and v2 naming %s with its own digest and sizes", rec.Spec, first.BuildID, second.BuildID)
	}
	builder := rec.Spec.Node
	other := map[string]*clustertest.Proc{"node-a": tc.nodeB, "node-b": tc.nodeA}[builder]
	if err := cluster.SetDrain(ctx, tc.cl, tc.ns, builder, true); err != nil {
		t.Fatal(err)
	}
	clustertest.Poll(t, time.Minute, "the drain seen", func(ctx context.Context) (bool, string) {
		code, body := get(t, tc.gw2.URL+"/health", tc.admin)
		return code == 204 && drained(ctx, t, tc.cl, tc.ns, builder), body
	})

	// serves creates ref through gateway 2 and returns what the start
	// command's server of its sandbox answers.
	// created is a sandbox of ref made through gateway 2 on other, not
	// on the drained builder.
	created := func(ref, builder string, other *clustertest.Proc) *client.SandboxConn {
		t.Helper()
		sb, err := a2.Create(ctx, client.CreateRequest{TemplateID: ref, Timeout: new(int64(600))})
		if err != nil {
			t.Fatalf("create of %s through gw-2: %v\n%s", ref, err, tailOf(other.Log, 4000))
		}
		sandboxes = append(sandboxes, sb.SandboxID)
		recordedOff(t, tc.records, sb.SandboxID, builder)
		conn, err := a2.Sandbox(ctx, sb.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		return conn
	}
	serves := func(ref string) string {
		t.Helper()
		conn := created(ref, builder, other)
		// Restored from the snapshot, the server is up already: one
		// request, no retries (a cold boot would run no start command).
		r, err := conn.Exec(ctx, "curl -s --max-time 30 http://127.0.0.1:8000/index.html", client.ExecOptions{})
		if err != nil {
			t.Fatalf("curl in the sandbox of %s: %v", ref, err)
		}
		return r.Stdout
	}
	if got := serves(alias); got != "served-by-the-first-build\n" {
		t.Errorf("the start command's server of %s on %s answers %q; want the first build's word", alias, other.Name, got)
	}
	if got := serves(alias + ":v2"); got != "served-by-v2\n" {
		t.Errorf("the start command's server of %s:v2 on %s answers %q; want v2's word", alias, other.Name, got)
	}
	if got := serves(alias); got != "served-by-the-first-build\n" { // pulled already
		t.Errorf("a second create of %s on %s: %q", alias, other.Name, got)
	}
	log, _ := os.ReadFile(other.Log)
	for what, want := range map[string]int{
		"cluster: pulling a template built on another node":   2,
		"cluster: captured a pulled template's start command": 2,
	} {
		if n := strings.Count(string(log), what); n != want {
			t.Errorf("%s logged %q %d times; want %d (once per build)", other.Name, what, n, want)
		}
	}

	// Tags through the gateways, by the SDK.
	if code, body := send(t, http.MethodPost, tc.gw1.URL+"/templates/tags", keyB, `{"target":"`+alias+`:v2","tags":["stolen"]}`); code != http.StatusNotFound {
		t.Errorf("team-b's assignTags on team-a's template: %d %s; want 404", code, body)
	}
	var assigned struct {
		BuildID string   `json:"buildId"`
		Tags    []string `json:"tags"`
	}
	sdkTags(t, tc.gw2.URL, keyA, "assign", alias+":v2", "prod", &assigned)
	if assigned.BuildID != second.BuildID {
		t.Errorf("assignTags(%s:v2, prod) answered %+v; want build %s", alias, assigned, second.BuildID)
	}
	rec, err = tc.records.Template(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if prod, ok := rec.Spec.Tag("prod"); !ok || prod.Build != second.BuildID || prod.Digest != v2.Digest {
		t.Errorf("the record after assignTags: %+v; want prod naming %s", rec.Spec, second.BuildID)
	}
	if _, ok := rec.Spec.Tag("stolen"); ok {
		t.Errorf("team-b's refused assign reached the record: %+v", rec.Spec)
	}
	if got := serves(alias + ":prod"); got != "served-by-v2\n" {
		t.Errorf("%s:prod on %s answers %q; want v2's word", alias, other.Name, got)
	}
	sdkTags(t, tc.gw1.URL, keyA, "remove", alias, "prod", nil)
	if rec, err := tc.records.Template(ctx, id); err != nil {
		t.Fatal(err)
	} else if _, ok := rec.Spec.Tag("prod"); ok {
		t.Errorf("the record after removeTags still has prod: %+v", rec.Spec)
	}
	if _, err := a2.Create(ctx, client.CreateRequest{TemplateID: alias + ":prod"}); !client.IsNotFound(err) {
		t.Errorf("create of the removed %s:prod on %s: %v; want a 404", alias, other.Name, err)
	}
	if log, _ := os.ReadFile(other.Log); strings.Count(string(log), "cluster: pulling a template built on another node") != 2 {
		t.Errorf("%s pulled again for a tag of a build it has", other.Name)
	}

	if err := cluster.SetDrain(ctx, tc.cl, tc.ns, builder, false); err != nil {
		t.Fatal(err)
	}
	clustertest.Poll(t, time.Minute, "the undrain seen", func(ctx context.Context) (bool, string) {
		return !drained(ctx, t, tc.cl, tc.ns, builder), ""
	})

	// A start command that needs the network: on its builder it runs
	// with the build's egress (capture.test is in the nodes' ceiling), on
	// a node that pulls the build with none, whatever the key of the
	// create that brings it there may reach. The create there fails
	// naming the start command, and the next create fails at once rather
	// than capture again.
	fetchPath := "/" + alias + "-net"
	netBuild := sdkBuild(t, tc.gw1.URL, keyA, alias+"-net",
		fmt.Sprintf("CELLA_BUILD_START_CMD=curl -sf -m 20 -o /tmp/fetched http://capture.test:%d%s && exec sleep infinity", tc.upstreamPort(), fetchPath),
		"CELLA_BUILD_READY_CMD=test -s /tmp/fetched")
	builtNet = netBuild.TemplateID
	if n := tc.hits(fetchPath); n != 1 {
		t.Fatalf("the builder's start command reached capture.test %d times; want once (the build's egress)", n)
	}
	netRec, err := tc.records.Template(ctx, netBuild.TemplateID)
	if err != nil {
		t.Fatal(err)
	}
	netBuilder := netRec.Spec.Node
	netOther := map[string]*clustertest.Proc{"node-a": tc.nodeB, "node-b": tc.nodeA}[netBuilder]
	if err := cluster.SetDrain(ctx, tc.cl, tc.ns, netBuilder, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.SetDrain(context.Background(), tc.cl, tc.ns, netBuilder, false) })
	clustertest.Poll(t, time.Minute, "the drain seen", func(ctx context.Context) (bool, string) {
		return drained(ctx, t, tc.cl, tc.ns, netBuilder) && !drained(ctx, t, tc.cl, tc.ns, netOther.Name), ""
	})
	var apiErr *client.APIError
	_, err = a2.Create(ctx, client.CreateRequest{TemplateID: alias + "-net"})
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusServiceUnavailable || !strings.Contains(apiErr.Message, "start command") {
		t.Errorf("create of %s-net on %s, whose start command needs egress: %v; want a 503 naming the start command", alias, netOther.Name, err)
	}
	_, err = a2.Create(ctx, client.CreateRequest{TemplateID: alias + "-net"})
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusServiceUnavailable || !strings.Contains(apiErr.Message, "runs it again") {
		t.Errorf("the next create of %s-net on %s: %v; want the same failure at once, with when it is tried again", alias, netOther.Name, err)
	}
	if n := tc.hits(fetchPath); n != 1 {
		t.Errorf("capture.test had %d requests of %s's start command; want only the builder's", n, alias+"-net")
	}
	log, _ = os.ReadFile(netOther.Log)
	captures := 0
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "running a pulled template's start command") && strings.Contains(l, netBuild.TemplateID) {
			captures++
		}
	}
	if captures != 1 {
		t.Errorf("%s ran the start command of %s %d times for two creates; want once", netOther.Name, netBuild.TemplateID, captures)
	}
	if err := cluster.SetDrain(ctx, tc.cl, tc.ns, netBuilder, false); err != nil {
		t.Fatal(err)
	}

	// A template built on a builtin with a service runs the service on
	// the node that pulled it too: the code interpreter answers.
	clustertest.Poll(t, time.Minute, "the undrain seen", func(ctx context.Context) (bool, string) {
		return !drained(ctx, t, tc.cl, tc.ns, netBuilder), ""
	})
	ci := sdkBuild(t, tc.gw1.URL, keyA, alias+"-ci", "CELLA_BUILD_FROM_TEMPLATE=code-interpreter-v1")
	builtCI = ci.TemplateID
	ciRec, err := tc.records.Template(ctx, ci.TemplateID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ciRec.Spec.Services, "code-interpreter") {
		t.Errorf("the record of a build on code-interpreter-v1: %+v; want its service", ciRec.Spec)
	}
	ciBuilder := ciRec.Spec.Node
	ciOther := map[string]*clustertest.Proc{"node-a": tc.nodeB, "node-b": tc.nodeA}[ciBuilder]
	if err := cluster.SetDrain(ctx, tc.cl, tc.ns, ciBuilder, true); err != nil {
		t.Fatal(err)
	}
	clustertest.Poll(t, time.Minute, "the drain seen", func(ctx context.Context) (bool, string) {
		return drained(ctx, t, tc.cl, tc.ns, ciBuilder) && !drained(ctx, t, tc.cl, tc.ns, ciOther.Name), ""
	})
	conn := created(alias+"-ci", ciBuilder, ciOther)
	// The agent starts the service with the sandbox; its first answer
	// may come after the create returns.
	var res client.CodeResult
	clustertest.Poll(t, 2*time.Minute, "the code interpreter answers", func(ctx context.Context) (bool, string) {
		res, err = conn.RunCode(ctx, "print(6 * 7)", "")
		return err == nil, fmt.Sprint(err)
	})
	if res.Stdout != "42\n" {
		t.Errorf("the code interpreter of %s-ci on %s ran print(6 * 7): %+v", alias, ciOther.Name, res)
	}
}

// sdkTags runs e2b@2.51.0's Template.assignTags (op "assign", name the
// target alias[:tag]) or removeTags (op "remove") through the gateway at
// url (compat/e2b/lib/cluster-tags.mjs) and decodes its answer into out.
func sdkTags(t *testing.T, url, key, op, name, tags string, out any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "lib/cluster-tags.mjs")
	cmd.Dir = filepath.Join(daemontest.RepoRoot(t), "compat", "e2b")
	cmd.Env = append(os.Environ(), "CELLA_E2B_URL="+url, "CELLA_E2B_KEY="+key, "CELLA_TAG_OP="+op, "CELLA_TAG_NAME="+name, "CELLA_TAG_TAGS="+tags)
	b, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("Template %s tags %s %s through %s: %v\n%s\n%s", op, name, tags, url, err, b, ee.Stderr)
		}
		t.Fatal(err)
	}
	if out != nil {
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), out); err != nil {
			t.Fatal(fmt.Errorf("Template %s tags answered %s: %w", op, b, err))
		}
	}
}
