package gateway_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/image/localregistry"
)

// TestClusterTemplates: templates on a cluster of two nodes and two
// gateways (real API server, real `cella serve` processes, Debian's
// docker-registry on loopback as the cluster's template registry).
//   - A template built through gateway 1 by the real E2B SDK's
//     Template.build (a COPY, so its files link and upload cross the
//     gateway, and a RUN) ends up as a Template record with the building
//     node, the reference and a digest the registry serves.
//   - With the building node drained, two concurrent creates of it
//     through gateway 2 land on the other node, which pulls it once by
//     digest, and the sandboxes see the build's files; that node's Lease
//     then lists it.
//   - GET /templates through either gateway lists it for its team, not
//     for another team's key, and the other team cannot see or use it
//     (404 alike for foreign and unknown).
//   - A record whose digest the registry does not serve, or naming an
//     image outside the cluster's registry, is refused by the node with
//     an error naming the template and the registry.
//   - DELETE removes the record; the node that pulled it drops its copy
//     on its next use (a create is then a 404 everywhere).
func TestClusterTemplates(t *testing.T) {
	tc := startTemplateCluster(t, "cella-templates")
	cp, cl, ns, reg, prefix, args, lease := tc.cp, tc.cl, tc.ns, tc.reg, tc.prefix, tc.args, tc.lease
	nodeA, nodeB, gw1, gw2, admin, records := tc.nodeA, tc.nodeB, tc.gw1, tc.gw2, tc.admin, tc.records
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	newClient := func(url, key string) *client.Client { return tc.client(t, url, key) }
	keyA, keyB := tc.keyOf(ctx, t, "team-a"), tc.keyOf(ctx, t, "team-b")
	a1, a2 := newClient(gw1.URL, keyA), newClient(gw2.URL, keyA)
	b1, b2 := newClient(gw1.URL, keyB), newClient(gw2.URL, keyB)
	var sandboxes []string
	// The template's copies, on every node (the template cache is this
	// host's, shared with other tests), go too when the test stops early.
	var built string
	nodes := []*clustertest.Proc{nodeA, nodeB}
	t.Cleanup(func() {
		for _, id := range sandboxes {
			_ = newClient(gw2.URL, admin).Kill(context.Background(), id)
		}
		for _, n := range nodes {
			if built != "" {
				_ = newClient(n.URL, admin).DeleteTemplate(context.Background(), built)
			}
		}
	})

	// The build, through gateway 1, by the real SDK.
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	alias := "cluster-demo-" + hex.EncodeToString(suffix)
	info := sdkBuild(t, gw1.URL, keyA, alias)
	id := info.TemplateID
	built = id
	rec, err := records.Template(ctx, id)
	if err != nil {
		t.Fatalf("no Template record of the build %s: %v", id, err)
	}
	t.Logf("record: %+v", rec.Spec)
	if rec.Spec.Team != "team-a" || !slices.Contains(rec.Spec.Aliases, alias) || rec.Spec.Build != info.BuildID ||
		rec.Spec.Reference != prefix+"/"+id+":"+info.BuildID || !strings.HasPrefix(rec.Spec.Digest, "sha256:") || rec.Spec.Node == "" ||
		rec.Spec.CPUCount != 1 || rec.Spec.MemoryMB != 768 {
		t.Fatalf("record %+v: want team-a, alias %s, build %s, reference %s/%s:%s, a digest, a node, 1 vCPU and 768 MiB", rec.Spec, alias, info.BuildID, prefix, id, info.BuildID)
	}
	if got := manifestDigest(t, reg.Addr, "cella-test/"+id, rec.Spec.Digest); got != rec.Spec.Digest {
		t.Fatalf("the registry serves %q for %s@%s", got, id, rec.Spec.Digest)
	}
	builder := rec.Spec.Node
	other := map[string]*clustertest.Proc{"node-a": nodeB, "node-b": nodeA}[builder]

	// Two creates through gateway 2 on the node that did not build it.
	if err := cluster.SetDrain(ctx, cl, ns, builder, true); err != nil {
		t.Fatal(err)
	}
	clustertest.Poll(t, time.Minute, "the drain seen", func(ctx context.Context) (bool, string) {
		code, body := get(t, gw2.URL+"/health", admin)
		return code == 204 && drained(ctx, t, cl, ns, builder), body
	})
	var wg sync.WaitGroup
	created := make([]client.Sandbox, 2)
	errs := make([]error, 2)
	for i, ref := range []string{alias, id} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			created[i], errs[i] = a2.Create(ctx, client.CreateRequest{TemplateID: ref, Timeout: new(int64(600))})
		}()
	}
	wg.Wait()
	for i := range created {
		if errs[i] != nil {
			t.Fatalf("create %d of the template through gw-2: %v\n%s", i, errs[i], tailOf(other.Log, 4000))
		}
		sandboxes = append(sandboxes, created[i].SandboxID)
	}
	for _, sb := range created {
		recordedOff(t, records, sb.SandboxID, builder)
		conn, err := a1.Sandbox(ctx, sb.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		r, err := conn.Exec(ctx, "cat /home/user/hello.txt /home/user/built.txt", client.ExecOptions{})
		if err != nil || r.Stdout != "copied through the gateway\nbuilt-in-the-cluster\n" {
			t.Fatalf("the sandbox on %s does not see the build's files: %+v %v", other.Name, r, err)
		}
		// The build's requested size came with the record (not E2B's
		// defaults, 2 and 1024, nor the node's create defaults).
		if d, err := a2.Get(ctx, sb.SandboxID); err != nil || d.CPUCount != 1 || d.MemoryMB != 768 {
			t.Errorf("the sandbox on %s: %v vCPUs, %d MiB (%v); want the build's 1 and 768", other.Name, d.CPUCount, d.MemoryMB, err)
		}
	}
	log, _ := os.ReadFile(other.Log)
	if n := strings.Count(string(log), "cluster: pulling a template built on another node"); n != 1 {
		t.Errorf("%s pulled the template %d times for two concurrent creates; want once", other.Name, n)
	}
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "cluster: pulled a template") {
			t.Logf("%s: %s", other.Name, l)
		}
	}
	clustertest.Poll(t, time.Minute, other.Name+"'s Lease lists the template", func(ctx context.Context) (bool, string) {
		nodes, err := cluster.Nodes(ctx, cl, ns)
		if err != nil {
			return false, err.Error()
		}
		for _, n := range nodes {
			if n.Name == other.Name {
				return slices.Contains(n.Capacity.Templates, id) && slices.Contains(n.Capacity.Templates, alias), fmt.Sprint(n.Capacity.Templates)
			}
		}
		return false, "no lease"
	})

	// Listings and tenancy.
	for _, c := range []*client.Client{a1, a2} {
		if ids := templateIDs(ctx, t, c); !slices.Contains(ids, id) || !slices.Contains(ids, "base") {
			t.Errorf("team-a's GET /templates lists %v; want %s and base", ids, id)
		}
	}
	for _, c := range []*client.Client{b1, b2} {
		if ids := templateIDs(ctx, t, c); slices.Contains(ids, id) || !slices.Contains(ids, "base") {
			t.Errorf("team-b's GET /templates lists %v; want base and not team-a's %s", ids, id)
		}
	}
	for _, gw := range []string{gw1.URL, gw2.URL} {
		for _, p := range []string{"/templates/aliases/" + alias, "/templates/" + id + "/tags", "/templates/" + id + "/builds/" + info.BuildID + "/status"} {
			code, body := get(t, gw+p, keyB)
			ucode, ubody := get(t, gw+strings.ReplaceAll(strings.ReplaceAll(p, id, "nosuchtemplate00000x"), alias, "no-such-alias"), keyB)
			if code/100 != 4 || code == 403 || code != ucode {
				t.Errorf("team-b's GET %s%s: %d %s; an unknown one: %d %s (want the same 4xx, never 403)", gw, p, code, body, ucode, ubody)
			}
		}
		if code, body := get(t, gw+"/templates/aliases/"+alias, keyA); code != 200 || !strings.Contains(body, id) {
			t.Errorf("team-a's GET %s/templates/aliases/%s: %d %s", gw, alias, code, body)
		}
	}
	for _, ref := range []string{alias, id} {
		_, err := b2.Create(ctx, client.CreateRequest{TemplateID: ref})
		if !client.IsNotFound(err) {
			t.Errorf("team-b's create of team-a's %s: %v; want a 404", ref, err)
		}
	}
	// An upload URL is its own credential: a forged one is refused by
	// the node that would have signed it, as one for no template is by
	// the gateway.
	hash := strings.Repeat("ab", 32)
	for _, tid := range []string{id, "nosuchtemplate00000x"} {
		code, body := send(t, http.MethodPut, gw2.URL+"/templates/"+tid+"/files/"+hash+"?team=team-b&expires=9999999999&token=forged", "", "x")
		if code != http.StatusForbidden {
			t.Errorf("a forged upload URL for %s: %d %s; want 403", tid, code, body)
		}
	}
	if err := b1.DeleteTemplate(ctx, id); !client.IsNotFound(err) {
		t.Errorf("team-b's delete of team-a's template: %v; want a 404", err)
	}

	// Published, any team may create from it, on the node that pulled it.
	if code, body := send(t, http.MethodPatch, gw1.URL+"/v2/templates/"+id, keyA, `{"public":true}`); code != 200 {
		t.Fatalf("publish through gw-1: %d %s", code, body)
	}
	if rec, err := records.Template(ctx, id); err != nil || !rec.Spec.Public {
		t.Fatalf("the record after the publish: %+v %v", rec, err)
	}
	pub, err := b2.Create(ctx, client.CreateRequest{TemplateID: id, Timeout: new(int64(600))})
	if err != nil {
		t.Fatalf("team-b's create of the published template: %v", err)
	}
	if err := b2.Kill(ctx, pub.SandboxID); err != nil {
		t.Fatal(err)
	}
	if code, body := send(t, http.MethodPatch, gw2.URL+"/v2/templates/"+id, keyA, `{"public":false}`); code != 200 {
		t.Fatalf("unpublish through gw-2: %d %s", code, body)
	}
	if _, err := b1.Create(ctx, client.CreateRequest{TemplateID: id}); !client.IsNotFound(err) {
		t.Errorf("team-b's create of the unpublished template: %v; want a 404", err)
	}

	// Records the node must refuse: a digest the registry does not serve
	// for the reference, and an image outside the cluster's registry.
	bad := "sha256:" + strings.Repeat("0", 64)
	for name, spec := range map[string]v1alpha1.TemplateSpec{
		"tampered0000000digst": {Team: "team-a", Aliases: []string{"tampered-digest"}, Node: builder, TemplateBuild: v1alpha1.TemplateBuild{
			Build: info.BuildID, Reference: prefix + "/tampered0000000digst:" + info.BuildID, Digest: bad}},
		"tampered00000000host": {Team: "team-a", Aliases: []string{"tampered-host"}, Node: builder, TemplateBuild: v1alpha1.TemplateBuild{
			Build: info.BuildID, Reference: "127.0.0.1:1/evil/tampered00000000host:" + info.BuildID, Digest: rec.Spec.Digest}},
	} {
		if name == "tampered0000000digst" {
			copyImage(t, reg.Addr, "cella-test/"+id+":"+info.BuildID, "cella-test/"+name+":"+info.BuildID)
		}
		if err := records.PutTemplate(ctx, &v1alpha1.Template{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}); err != nil {
			t.Fatal(err)
		}
		_, err := a2.Create(ctx, client.CreateRequest{TemplateID: name})
		var ae *client.APIError
		// A record naming another registry is refused before any pull.
		wantStatus := map[string]int{"tampered0000000digst": 503, "tampered00000000host": 400}[name]
		if !errors.As(err, &ae) || ae.Status != wantStatus || !strings.Contains(ae.Message, name) || !strings.Contains(ae.Message, reg.Addr) {
			t.Errorf("create of the record %s (%+v): %v; want a %d naming the template and the registry %s", name, spec, err, wantStatus, reg.Addr)
		}
		t.Logf("record %s refused: %v", name, err)
		if ids := templateIDs(ctx, t, newClient(other.URL, admin)); slices.Contains(ids, name) {
			t.Errorf("%s imported the refused record %s: %v", other.Name, name, ids)
		}
	}

	// A rebuild while the builder is drained goes to another node, here
	// one that never had the template (the puller drained too): the alias
	// keeps its template ID, the record moves to the new builder with the
	// new build.
	nodeC := cp.StartNode(t, clustertest.NodeOptions{Name: "node-c", Namespace: ns, Args: args, LeaseDuration: lease})
	nodes = append(nodes, nodeC)
	clustertest.WaitLive(t, cl, ns, 3)
	if err := cluster.SetDrain(ctx, cl, ns, other.Name, true); err != nil {
		t.Fatal(err)
	}
	clustertest.Poll(t, time.Minute, "the drain seen", func(ctx context.Context) (bool, string) {
		return drained(ctx, t, cl, ns, other.Name), ""
	})
	// A team's alias is its own cluster-wide: another team's build of it,
	// here on node-c, which never had the template, is E2B's 409.
	if code, body := send(t, http.MethodPost, gw1.URL+"/v3/templates", keyB, `{"name":"`+alias+`"}`); code != http.StatusConflict {
		t.Errorf("team-b's build request for team-a's alias: %d %s; want 409", code, body)
	}
	info2 := sdkBuild(t, gw2.URL, keyA, alias)
	rec2, err := records.Template(ctx, id)
	if err != nil || info2.TemplateID != id || info2.BuildID == info.BuildID || rec2.Spec.Node != nodeC.Name ||
		rec2.Spec.Build != info2.BuildID || rec2.Spec.Digest == "" || rec2.Spec.Digest == rec.Spec.Digest {
		t.Fatalf("the rebuild with %s drained: %+v; record %+v %v; want template %s, a new build and digest, built on %s", builder, info2, rec2, err, id, nodeC.Name)
	}
	if err := cluster.SetDrain(ctx, cl, ns, other.Name, false); err != nil {
		t.Fatal(err)
	}
	// The puller, whose copy is the first build, pulls the new one.
	if err := cluster.SetDrain(ctx, cl, ns, nodeC.Name, true); err != nil {
		t.Fatal(err)
	}
	clustertest.Poll(t, time.Minute, "the drain seen", func(ctx context.Context) (bool, string) {
		return drained(ctx, t, cl, ns, nodeC.Name) && !drained(ctx, t, cl, ns, other.Name), ""
	})
	again, err := a1.Create(ctx, client.CreateRequest{TemplateID: alias, Timeout: new(int64(600))})
	if err != nil {
		t.Fatalf("create of the rebuilt template on %s: %v", other.Name, err)
	}
	sandboxes = append(sandboxes, again.SandboxID)
	conn, err := a1.Sandbox(ctx, again.SandboxID) // the gateway that placed it: the node records it within a second
	if err != nil {
		t.Fatal(err)
	}
	if r, err := conn.Exec(ctx, "cat /home/user/built.txt", client.ExecOptions{}); err != nil || r.Stdout != "built-in-the-cluster\n" {
		t.Errorf("the rebuilt template's sandbox: %+v %v", r, err)
	}
	if log, _ := os.ReadFile(other.Log); strings.Count(string(log), "cluster: pulling a template built on another node\" template="+id+" build="+info2.BuildID) != 1 {
		t.Errorf("%s did not pull the rebuild %s once", other.Name, info2.BuildID)
	}
	clustertest.Poll(t, time.Minute, "the create recorded", func(ctx context.Context) (bool, string) {
		_, err := records.Sandbox(ctx, again.SandboxID)
		return err == nil, fmt.Sprint(err)
	})

	// DELETE through gateway 2 (after the sandboxes of it are gone).
	for _, id := range sandboxes {
		if err := a2.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	sandboxes = nil
	if err := a2.DeleteTemplate(ctx, alias); err != nil {
		t.Fatalf("delete through gw-2: %v", err)
	}
	if _, err := records.Template(ctx, id); err == nil {
		t.Errorf("the record of %s outlived its delete", id)
	}
	for _, c := range []*client.Client{a1, a2} {
		if ids := templateIDs(ctx, t, c); slices.Contains(ids, id) {
			t.Errorf("GET /templates lists %s after its delete: %v", id, ids)
		}
	}
	if _, err := a1.Create(ctx, client.CreateRequest{TemplateID: alias}); !client.IsNotFound(err) {
		t.Errorf("create of the deleted template on %s: %v; want a 404", other.Name, err)
	}
	if ids := templateIDs(ctx, t, newClient(other.URL, admin)); slices.Contains(ids, id) {
		t.Errorf("%s kept its pulled copy of the deleted %s after its next use: %v", other.Name, id, ids)
	}
}

// templateCluster is two nodes and two gateways on a real API server,
// with Debian's docker-registry on loopback as the cluster's template
// registry.
type templateCluster struct {
	cp           *clustertest.ControlPlane
	cl           crclient.Client
	ns           string
	reg          *localregistry.Registry
	prefix       string
	args         []string
	lease        time.Duration
	nodeA, nodeB *clustertest.Proc
	gw1, gw2     *clustertest.Proc
	admin        string
	records      *cluster.Records
	// upstream is an HTTP server on this host's loopback that the nodes'
	// egress ceiling names as capture.test (so builds may reach it);
	// upstreamHits counts its requests by path.
	upstream     *httptest.Server
	upstreamMu   sync.Mutex
	upstreamHits map[string]int
}

// hits is how many requests the upstream has had for path.
func (tc *templateCluster) hits(path string) int {
	tc.upstreamMu.Lock()
	defer tc.upstreamMu.Unlock()
	return tc.upstreamHits[path]
}

// upstreamPort is the port sandboxes reach the upstream on as capture.test.
func (tc *templateCluster) upstreamPort() int { return tc.upstream.Listener.Addr().(*net.TCPAddr).Port }

func startTemplateCluster(t *testing.T, ns string) *templateCluster {
	t.Helper()
	cp, cl := clustertest.StartIn(t, ns)
	reg, err := localregistry.Run(t.TempDir(), "", "")
	if errors.Is(err, localregistry.ErrNotInstalled) {
		t.Fatal(err) // make deps installs it; a cluster run must not skip this
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Stop)
	tc := &templateCluster{cp: cp, cl: cl, ns: ns, reg: reg, prefix: reg.Addr + "/cella-test", records: cluster.NewRecords(cl, ns),
		upstreamHits: map[string]int{}}
	tc.upstream = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tc.upstreamMu.Lock()
		tc.upstreamHits[r.URL.Path]++
		tc.upstreamMu.Unlock()
		_, _ = io.WriteString(w, "fetched "+r.URL.Path)
	}))
	t.Cleanup(tc.upstream.Close)
	tc.args = []string{"--template-registry=" + tc.prefix, "--insecure-registry=" + reg.Addr,
		"--egress-allow=capture.test", fmt.Sprintf("--egress-resolve=capture.test=127.0.0.1:%d", tc.upstreamPort())}
	// Nothing here waits for a lapse (a node leaves by a clean stop), and
	// a push's compression on this loaded machine has held a renewal past
	// the 3 s default: leases of 10 s.
	tc.lease = 10 * time.Second
	tc.nodeA = cp.StartNode(t, clustertest.NodeOptions{Name: "node-a", Namespace: ns, Args: tc.args, LeaseDuration: tc.lease})
	tc.nodeB = cp.StartNode(t, clustertest.NodeOptions{Name: "node-b", Namespace: ns, Args: tc.args, LeaseDuration: tc.lease})
	tc.gw1 = cp.StartGateway(t, "gw-1", ns)
	tc.gw2 = cp.StartGateway(t, "gw-2", ns)
	clustertest.WaitLive(t, cl, ns, 2)
	tc.admin = tc.nodeA.AdminKey(t)
	return tc
}

// client is a client of the cella API at url with key.
func (tc *templateCluster) client(t *testing.T, url, key string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{URL: url, APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// keyOf makes an API key of team, through gateway 1.
func (tc *templateCluster) keyOf(ctx context.Context, t *testing.T, team string) string {
	t.Helper()
	k, err := tc.client(t, tc.gw1.URL, tc.admin).CreateKey(ctx, client.NewKey{Name: team + "-key", Team: team})
	if err != nil {
		t.Fatalf("key of %s: %v", team, err)
	}
	return k.Key
}

type buildInfo struct {
	TemplateID string   `json:"templateId"`
	BuildID    string   `json:"buildId"`
	Logs       []string `json:"logs"`
}

// sdkBuild builds alias through the gateway at url with e2b@2.51.0's
// Template.build (compat/e2b/lib/cluster-build.mjs; env: its optional
// CELLA_BUILD_* settings).
func sdkBuild(t *testing.T, url, key, alias string, env ...string) buildInfo {
	t.Helper()
	dir := filepath.Join(daemontest.RepoRoot(t), "compat", "e2b")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b-2.51.0")); err != nil {
		t.Fatalf("compat/e2b's SDKs are not installed (make test-cluster runs npm ci there): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "lib/cluster-build.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CELLA_E2B_URL="+url, "CELLA_E2B_KEY="+key, "CELLA_BUILD_ALIAS="+alias)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("Template.build through %s: %v\n%s\n%s", url, err, out, ee.Stderr)
		}
		t.Fatal(err)
	}
	var info buildInfo
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &info); err != nil || info.TemplateID == "" {
		t.Fatalf("Template.build answered %s: %v", out, err)
	}
	t.Logf("built %s (%s) through %s; log:\n%s", info.TemplateID, info.BuildID, url, strings.Join(info.Logs, "\n"))
	return info
}

// manifestDigest is the digest the registry at addr serves for repo@digest.
func manifestDigest(t *testing.T, addr, repo, digest string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodHead, "http://"+addr+"/v2/"+repo+"/manifests/"+digest, nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return resp.Status
	}
	return resp.Header.Get("Docker-Content-Digest")
}

// copyImage copies an image within the registry (crane-style, through
// go-containerregistry), so a record can name a repository that holds a
// real image whose digest is not the record's.
func copyImage(t *testing.T, addr, from, to string) {
	t.Helper()
	src, err := name.ParseReference(addr+"/"+from, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := name.ParseReference(addr+"/"+to, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(dst, img); err != nil {
		t.Fatal(err)
	}
}

// recordedOff waits for the record of sandbox id, which must not be on
// the drained node builder.
func recordedOff(t *testing.T, records *cluster.Records, id, builder string) {
	t.Helper()
	clustertest.Poll(t, time.Minute, "the create recorded", func(ctx context.Context) (bool, string) {
		r, err := records.Sandbox(ctx, id)
		if err != nil {
			return false, err.Error()
		}
		if r.Spec.Node == builder {
			t.Fatalf("sandbox %s landed on the drained builder %s", id, builder)
		}
		return true, ""
	})
}

func drained(ctx context.Context, t *testing.T, cl crclient.Client, ns, node string) bool {
	nodes, err := cluster.Nodes(ctx, cl, ns)
	if err != nil {
		return false
	}
	for _, n := range nodes {
		if n.Name == node {
			return n.Drained()
		}
	}
	return false
}

func templateIDs(ctx context.Context, t *testing.T, c *client.Client) []string {
	t.Helper()
	ts, err := c.ListTemplates(ctx)
	if err != nil {
		t.Fatalf("GET /templates: %v", err)
	}
	var ids []string
	for _, tp := range ts {
		ids = append(ids, tp.TemplateID)
	}
	return ids
}

// send is one request with a JSON body as key.
func send(t *testing.T, method, url, key, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestClusterKeepsLocalTemplates: an API template a daemon built before it
// joined a cluster has no Template record, and that is no deletion: the
// node, restarted on its data dir as a cluster node, still creates from
// it (only a copy the cluster recorded is dropped when its record goes).
func TestClusterKeepsLocalTemplates(t *testing.T) {
	const ns = "cella-keep"
	cp, cl := clustertest.StartIn(t, ns)
	dir, err := os.MkdirTemp("", "cella-keep-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // last: after the node stopped
		if left := daemontest.MountsUnder(dir); len(left) > 0 {
			t.Errorf("mounts left under %s: %v", dir, left)
			return
		}
		os.RemoveAll(dir)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	env := daemontest.Start(t, "gvisor", daemontest.Options{DataDir: dir})
	c, err := client.New(client.Config{URL: env.URL, APIKey: env.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	alias := "pre-cluster-" + hex.EncodeToString(suffix)
	tb := &client.TemplateBuilds{C: c}
	if err := tb.Build(ctx, build.Spec{Name: alias, Base: build.Base{Template: "base"},
		Steps: []build.Step{{Type: build.StepRun, Args: []string{"echo made-standalone > /home/user/pre.txt"}}}}, nil); err != nil {
		t.Fatalf("standalone build: %v", err)
	}
	env.Close()

	node := cp.StartNode(t, clustertest.NodeOptions{Name: "node-a", Namespace: ns, DataDir: dir})
	clustertest.WaitLive(t, cl, ns, 1)
	// The cluster's admin key (the data dir's admin.key is the standalone
	// daemon's).
	admin, err := cluster.AdminKey(ctx, cl, ns, func() (string, error) { return "", errors.New("no cluster admin key yet") })
	if err != nil {
		t.Fatal(err)
	}
	nc, err := client.New(client.Config{URL: node.URL, APIKey: admin})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := nc.Create(ctx, client.CreateRequest{TemplateID: alias, Timeout: new(int64(300))})
	if err != nil {
		t.Fatalf("create of the pre-cluster template on the cluster node: %v", err)
	}
	t.Cleanup(func() { // the template cache is this host's, shared with other tests
		_ = nc.Kill(context.Background(), sb.SandboxID)
		if err := nc.DeleteTemplate(context.Background(), alias); err != nil {
			t.Errorf("delete the pre-cluster template: %v", err)
		}
	})
	conn, err := nc.Sandbox(ctx, sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := conn.Exec(ctx, "cat /home/user/pre.txt", client.ExecOptions{}); err != nil || r.Stdout != "made-standalone\n" {
		t.Errorf("the pre-cluster template's sandbox: %+v %v", r, err)
	}
	ts, err := nc.ListTemplates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ts, func(tp client.Template) bool { return slices.Contains(tp.Aliases, alias) }) {
		t.Errorf("the node no longer lists the pre-cluster template %s: %v", alias, ts)
	}
}
