package gateway_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/clustertest"
)

// answer is one HTTP exchange's status and body (err: no answer at all),
// for requests sent from goroutines, which must not call t.Fatal.
type answer struct {
	code int
	body string
	err  error
}

func send1(ctx context.Context, method, url, key, body string) answer {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader([]byte(body)))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, body: string(b), err: err}
}

// sendAll sends every request at once (released together) and returns
// the answers in order.
func sendAll(ctx context.Context, reqs []func(context.Context) answer) []answer {
	out := make([]answer, len(reqs))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i] = r(ctx)
		}()
	}
	close(start)
	wg.Wait()
	return out
}

// newKeyWith makes an API key of team through url with more fields
// ("" or `"maxSandboxes":3,...`).
func newKeyWith(t *testing.T, url, admin, name, team, more string) string {
	t.Helper()
	body := fmt.Sprintf(`{"name":%q,"team":%q}`, name, team)
	if more != "" {
		body = body[:len(body)-1] + "," + more + "}"
	}
	code, answer := call(t, "POST", url+"/keys", admin, body)
	if code != http.StatusCreated {
		t.Fatalf("POST /keys %s: %d %s", name, code, answer)
	}
	var k struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal([]byte(answer), &k); err != nil || k.Key == "" {
		t.Fatalf("POST /keys answer %s: %v", answer, err)
	}
	return k.Key
}

// TestClusterAliasRace: two teams asking for one new template alias at the
// same moment on two nodes (POST /v3/templates, E2B's build request, which
// records the template before it answers) — exactly one gets it, the
// other E2B's 409 "Alias '...' is already used by another team", and the
// cluster holds one record of the alias, the winner's. Forty rounds, the
// two requests released together: before the reservation (a check of the
// records) both teams got the alias in some of them (rounds 12 and 1 of
// two runs). Then: a deleted template's alias
// is free again for the other team, and a reservation its node never
// completed (it died between the reservation and the record) is taken
// over once stale instead of holding the alias for ever.
func TestClusterAliasRace(t *testing.T) {
	const ns = "cella-aliasrace"
	cp, cl := clustertest.StartIn(t, ns)
	nodeA := cp.StartNode(t, clustertest.NodeOptions{Name: "node-a", Namespace: ns})
	nodeB := cp.StartNode(t, clustertest.NodeOptions{Name: "node-b", Namespace: ns})
	clustertest.WaitLive(t, cl, ns, 2)
	admin := nodeA.AdminKey(t)
	alpha := newKey(t, nodeA.URL, admin, "alpha", "alpha")
	beta := newKey(t, nodeA.URL, admin, "beta", "beta")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	tag := hex.EncodeToString(suffix)

	// Made first, so the rounds below age it.
	ghostAlias := "ghost-" + tag
	ghost := &v1alpha1.TemplateAlias{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cluster.AliasRecordName(ghostAlias)},
		Spec: v1alpha1.TemplateAliasSpec{Alias: ghostAlias, Team: "gone", Template: "nosuchtemplate000000"}}
	if err := cl.Create(ctx, ghost); err != nil {
		t.Fatal(err)
	}

	type side struct {
		url, key, team string
	}
	sides := []side{{nodeA.URL, alpha, "alpha"}, {nodeB.URL, beta, "beta"}}
	records := cluster.NewRecords(cl, ns)
	var last struct {
		alias  string
		winner side
		loser  side
		id     string
	}
	wins := map[string]int{}
	const rounds = 40
	for i := range rounds {
		alias := fmt.Sprintf("race-%s-%d", tag, i)
		body := fmt.Sprintf(`{"name":%q}`, alias)
		answers := sendAll(ctx, []func(context.Context) answer{
			func(ctx context.Context) answer {
				return send1(ctx, "POST", sides[0].url+"/v3/templates", sides[0].key, body)
			},
			func(ctx context.Context) answer {
				return send1(ctx, "POST", sides[1].url+"/v3/templates", sides[1].key, body)
			},
		})
		won := -1
		for j, a := range answers {
			switch {
			case a.err != nil:
				t.Fatalf("round %d, team %s: %v", i, sides[j].team, a.err)
			case a.code/100 == 2 && won == -1:
				won = j
			case a.code/100 == 2:
				t.Fatalf("round %d: both teams got alias %s (%s; %s)", i, alias, answers[0].body, answers[1].body)
			case a.code == http.StatusConflict:
				if want := fmt.Sprintf("Alias '%s' is already used by another team", alias); !strings.Contains(a.body, want) {
					t.Errorf("round %d, team %s: 409 %s, want E2B's %q", i, sides[j].team, a.body, want)
				}
			default:
				t.Fatalf("round %d, team %s: %d %s", i, sides[j].team, a.code, a.body)
			}
		}
		if won == -1 {
			t.Fatalf("round %d: neither team got alias %s (%s; %s)", i, alias, answers[0].body, answers[1].body)
		}
		wins[sides[won].team]++
		var got struct {
			TemplateID string `json:"templateID"`
		}
		if err := json.Unmarshal([]byte(answers[won].body), &got); err != nil || got.TemplateID == "" {
			t.Fatalf("round %d: the winner's answer %s: %v", i, answers[won].body, err)
		}
		all, err := records.Templates(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var holders []string
		for _, r := range all {
			for _, a := range r.Spec.Aliases {
				if a == alias {
					holders = append(holders, r.Spec.Team+"/"+r.Name)
				}
			}
		}
		if len(holders) != 1 || holders[0] != sides[won].team+"/"+got.TemplateID {
			t.Fatalf("round %d: records of alias %s: %v, want only %s/%s", i, alias, holders, sides[won].team, got.TemplateID)
		}
		last.alias, last.winner, last.loser, last.id = alias, sides[won], sides[1-won], got.TemplateID
	}
	t.Logf("%d rounds, wins by team: %v", rounds, wins)

	// Deleting the template frees its alias cluster-wide.
	if code, body := call(t, "DELETE", last.winner.url+"/templates/"+last.id, last.winner.key, ""); code != http.StatusNoContent {
		t.Fatalf("delete the winner's template %s: %d %s", last.id, code, body)
	}
	aliasObj := &v1alpha1.TemplateAlias{}
	if err := cl.Get(ctx, types.NamespacedName{Namespace: ns, Name: cluster.AliasRecordName(last.alias)}, aliasObj); !apierrors.IsNotFound(err) {
		t.Errorf("the alias reservation outlived its template: %+v %v", aliasObj.Spec, err)
	}
	if code, body := call(t, "POST", last.loser.url+"/v3/templates", last.loser.key, fmt.Sprintf(`{"name":%q}`, last.alias)); code/100 != 2 {
		t.Fatalf("team %s takes the freed alias %s: %d %s", last.loser.team, last.alias, code, body)
	}

	// The ghost: refused while it may still be on its way to a record,
	// taken over once stale (a minute after it was made).
	if code, body := call(t, "POST", nodeB.URL+"/v3/templates", beta, fmt.Sprintf(`{"name":%q}`, ghostAlias)); code != http.StatusConflict && code/100 != 2 {
		t.Fatalf("the ghost's alias: %d %s", code, body)
	}
	clustertest.Poll(t, 3*time.Minute, "a stale alias reservation taken over", func(ctx context.Context) (bool, string) {
		a := send1(ctx, "POST", nodeB.URL+"/v3/templates", beta, fmt.Sprintf(`{"name":%q}`, ghostAlias))
		return a.err == nil && a.code/100 == 2, fmt.Sprint(a.code, a.body, a.err)
	})
	if err := cl.Get(ctx, crclient.ObjectKeyFromObject(ghost), aliasObj); err != nil || aliasObj.Spec.Team != "beta" {
		t.Errorf("the taken-over reservation: %+v %v", aliasObj.Spec, err)
	}
}

// TestClusterKeyQuotas: a key's maxSandboxes holds across the nodes of a
// cluster, not per node (real API server, two nodes, two gateways, real
// gVisor sandboxes).
//   - 8 creates at once through two gateways of a key with maxSandboxes 3:
//     exactly 3 sandboxes exist, on whatever nodes, and 5 answers are
//     E2B's 429 naming the limit, its value and the command that raises
//     it. The same with 4 creates sent to each node directly (before, each
//     node allowed 3: 6 succeeded).
//   - Killing them frees the slots: 3 creates succeed again, the 4th is
//     a 429.
//   - A node killed -9 while it holds the key's 3 slots gives them back
//     once its Lease lapses: the other node then creates 3, not one more.
func TestClusterKeyQuotas(t *testing.T) {
	const ns = "cella-keyquota"
	cp, cl := clustertest.StartIn(t, ns)
	nodeA := cp.StartNode(t, clustertest.NodeOptions{Name: "node-a", Namespace: ns})
	nodeB := cp.StartNode(t, clustertest.NodeOptions{Name: "node-b", Namespace: ns})
	gw1 := cp.StartGateway(t, "gw-1", ns)
	gw2 := cp.StartGateway(t, "gw-2", ns)
	clustertest.WaitLive(t, cl, ns, 2)
	admin := nodeA.AdminKey(t)
	key := newKeyWith(t, gw1.URL, admin, "q", "quota-team", `"maxSandboxes":3`)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	const create = `{"templateID":"base","timeout":600}`
	var mu sync.Mutex
	made := map[string]string{} // sandbox ID → the URL that made it
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for id := range made {
			for _, u := range []string{nodeA.URL, nodeB.URL} {
				send1(context.Background(), "DELETE", u+"/sandboxes/"+id, admin, "")
			}
		}
	})
	// burst sends one create to each URL at once and checks that want
	// succeed and the rest are the limit's 429.
	burst := func(what string, urls []string, want int) []string {
		t.Helper()
		var reqs []func(context.Context) answer
		for _, u := range urls {
			reqs = append(reqs, func(ctx context.Context) answer { return send1(ctx, "POST", u+"/sandboxes", key, create) })
		}
		answers := sendAll(ctx, reqs)
		var ids, codes []string
		refused := 0
		for i, a := range answers {
			if a.err != nil {
				t.Fatalf("%s: create %d: %v", what, i, a.err)
			}
			codes = append(codes, fmt.Sprint(a.code))
			switch a.code {
			case http.StatusCreated:
				var sb struct {
					SandboxID string `json:"sandboxID"`
				}
				if err := json.Unmarshal([]byte(a.body), &sb); err != nil || sb.SandboxID == "" {
					t.Fatalf("%s: create answer %s: %v", what, a.body, err)
				}
				mu.Lock()
				made[sb.SandboxID] = urls[i]
				mu.Unlock()
				ids = append(ids, sb.SandboxID)
			case http.StatusTooManyRequests:
				refused++
				var e struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				}
				if err := json.Unmarshal([]byte(a.body), &e); err != nil || e.Code != 429 {
					t.Errorf("%s: the 429 is not E2B's shape: %s", what, a.body)
				}
				for _, part := range []string{"maxSandboxes", "limit of 3", "cella key update q --max-sandboxes N"} {
					if !strings.Contains(e.Message, part) {
						t.Errorf("%s: the 429 %q does not say %q", what, e.Message, part)
					}
				}
			default:
				t.Fatalf("%s: create %d: %d %s", what, i, a.code, a.body)
			}
		}
		if len(ids) != want || refused != len(urls)-want {
			t.Fatalf("%s: %d created, %d refused (%v), want %d and %d", what, len(ids), refused, codes, want, len(urls)-want)
		}
		return ids
	}
	kill := func(ids []string) {
		t.Helper()
		for _, id := range ids {
			if code, body := call(t, "DELETE", gw1.URL+"/sandboxes/"+id, key, ""); code != http.StatusNoContent {
				t.Fatalf("kill %s: %d %s", id, code, body)
			}
		}
	}
	nodeOf := func(id string) string {
		sb := &v1alpha1.Sandbox{}
		var node string
		clustertest.Poll(t, time.Minute, "the record of "+id, func(ctx context.Context) (bool, string) {
			err := cl.Get(ctx, types.NamespacedName{Namespace: ns, Name: id}, sb)
			node = sb.Spec.Node
			return err == nil, fmt.Sprint(err)
		})
		return node
	}

	var through []string
	for i := range 8 {
		through = append(through, []string{gw1.URL, gw2.URL}[i%2])
	}
	ids := burst("8 through two gateways", through, 3)
	var nodes []string
	for _, id := range ids {
		nodes = append(nodes, nodeOf(id))
	}
	t.Logf("through the gateways: sandboxes on %v", nodes)
	kill(ids)

	// Killed slots are free again: every node's count is 0 within a
	// second (polled: the other node may read this one's count of a
	// second ago).
	freed := func(what string) {
		t.Helper()
		clustertest.Poll(t, time.Minute, what, func(ctx context.Context) (bool, string) {
			var l v1alpha1.KeyUsageList
			if err := cl.List(ctx, &l, crclient.InNamespace(ns)); err != nil {
				return false, err.Error()
			}
			held := 0
			for _, ku := range l.Items {
				for _, u := range ku.Spec.Nodes {
					held += u.Sandboxes
				}
			}
			return held == 0, fmt.Sprint(l.Items)
		})
	}
	freed("the killed slots freed")
	direct := []string{nodeA.URL, nodeB.URL, nodeA.URL, nodeB.URL, nodeA.URL, nodeB.URL, nodeA.URL, nodeB.URL}
	kill(burst("4 on each node", direct, 3))
	freed("the killed slots freed again")

	// A node killed -9 holding the key's 3 slots: once its Lease lapses
	// (3 s), the other node may use them, and no more.
	burst("3 on node-a", []string{nodeA.URL, nodeA.URL, nodeA.URL, nodeA.URL}, 3)
	burst("one past the limit on node-b", []string{nodeB.URL}, 0)
	nodeA.Kill()
	clustertest.Poll(t, 2*time.Minute, "node-a's slots given back after its kill -9", func(ctx context.Context) (bool, string) {
		nodes, err := cluster.Nodes(ctx, cl, ns)
		for _, n := range nodes {
			if n.Name == "node-a" && n.Live {
				return false, "node-a's Lease is live"
			}
		}
		return err == nil, fmt.Sprint(err)
	})
	burst("3 on node-b with node-a dead", []string{nodeB.URL, nodeB.URL, nodeB.URL, nodeB.URL}, 3)
}
