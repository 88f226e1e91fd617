package gateway_test

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/gateway"
)

// TestHolderAsksBounded: requests for a sandbox ID no record names make
// the gateway ask the live nodes whether one holds it (holder.go), and
// that costs every node a request — so it is bounded. A burst with a bad
// key asks no node at all (a 401 first); a burst of concurrent requests
// for one unknown ID, as one key over the API and as sandbox traffic,
// asks each node at most once per gateway.MissTTL of the burst's length
// (plus one), not once per request. The nodes' questions are counted by
// their own metrics: each is a 404 of GET /sandboxes/{id} there. Before
// the bound, every request asked every node (2 × 200 here).
func TestHolderAsksBounded(t *testing.T) {
	const ns = "cella-holder"
	cp, cl := clustertest.StartIn(t, ns)
	nodeA := cp.StartNode(t, clustertest.NodeOptions{Name: "node-a", Namespace: ns})
	nodeB := cp.StartNode(t, clustertest.NodeOptions{Name: "node-b", Namespace: ns})
	nodes := []*clustertest.Proc{nodeA, nodeB}
	gw := cp.StartGateway(t, "gw-1", ns)
	clustertest.WaitLive(t, cl, ns, 2)
	admin := nodeA.AdminKey(t)
	bob := newKey(t, gw.URL, admin, "bob", "beta")
	asked := func() int {
		n := 0
		for _, node := range nodes {
			n += notFoundGets(t, node.URL, admin)
		}
		return n
	}

	// burst sends workers × each requests at once and returns how long
	// it took, from before the first to after the last answer.
	burst := func(workers, each int, send func() int, want int) time.Duration {
		t.Helper()
		start := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var wrong []int
		for range workers {
			wg.Go(func() {
				for range each {
					if code := send(); code != want {
						mu.Lock()
						wrong = append(wrong, code)
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		if len(wrong) > 0 {
			t.Fatalf("%d answers were not %d: %v", len(wrong), want, wrong[:min(len(wrong), 10)])
		}
		return time.Since(start)
	}
	// bound is what asking each node once per MissTTL of d, plus once,
	// costs.
	bound := func(d time.Duration) int { return len(nodes) * (int(d/gateway.MissTTL) + 1) }

	const unknown = "nosuchsandbox00000000"
	before := asked()
	burst(10, 10, func() int {
		code, _ := call(t, "GET", gw.URL+"/sandboxes/"+unknown, "e2b_0000000000000000000000000000dead", "")
		return code
	}, http.StatusUnauthorized)
	if got := asked() - before; got != 0 {
		t.Errorf("100 requests with a bad key for an unknown sandbox asked the nodes %d times, want 0", got)
	}

	before = asked()
	took := burst(20, 10, func() int {
		code, _ := call(t, "GET", gw.URL+"/sandboxes/"+unknown, bob, "")
		return code
	}, http.StatusNotFound)
	got := asked() - before
	t.Logf("200 API requests for an unknown sandbox in %v asked the nodes %d times", took, got)
	if got > bound(took) {
		t.Errorf("200 API requests for an unknown sandbox in %v asked the nodes %d times, want at most %d (each node once per %v)", took, got, bound(took), gateway.MissTTL)
	}

	before = asked()
	took = burst(20, 10, func() int {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, gw.URL+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = "49983-" + unknown + ".cella.test"
		code, _ := do(t, req)
		return code
	}, http.StatusBadGateway) // E2B's edge answer for a sandbox it cannot reach
	got = asked() - before
	t.Logf("200 sandbox traffic requests for an unknown sandbox in %v asked the nodes %d times", took, got)
	if got > bound(took) {
		t.Errorf("200 sandbox traffic requests for an unknown sandbox in %v asked the nodes %d times, want at most %d", took, got, bound(took))
	}
	if got == 0 {
		t.Errorf("sandbox traffic for a sandbox without a record asked no node: the test no longer counts the gateway's questions")
	}
}

// notFoundGets is how many GET /sandboxes/{id} node answered 404, by its
// metrics.
func notFoundGets(t *testing.T, node, admin string) int {
	t.Helper()
	code, body := call(t, "GET", node+"/metrics", admin, "")
	if code != http.StatusOK {
		t.Fatalf("GET %s/metrics: %d %s", node, code, body)
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "cella_api_errors_total{") && strings.Contains(line, `route="GET /sandboxes/{id}"`) && strings.Contains(line, `status="404"`) {
			f := strings.Fields(line)
			n, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("metrics line %q: %v", line, err)
			}
			return int(n)
		}
	}
	return 0
}
