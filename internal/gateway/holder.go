package gateway

import (
	"context"
	"net/http"
	"regexp"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/store"
)

// Sandboxes without a record yet. The records follow the nodes: a node
// writes its sandboxes' records once a recordInterval (a second), and not
// at all while its writes fail or wait on the API server. A sandbox made on
// a node directly, or through another gateway replica, has none until
// then — and a request for it through this gateway meanwhile must not be a
// 404 for a sandbox that exists (E2B's SDKs take a 404 as gone for good).
// So before it answers that, the gateway asks the live nodes themselves,
// which are the truth the records lag behind.
//
// That question goes to every node, so it is bounded: only an
// authenticated request (a bad key is a 401 before anything is routed,
// gateway.go) or sandbox traffic asks, concurrent requests for one ID as
// one key share one question, and a "no node holds it" answers the same
// key and ID for missTTL without asking again (a client hammering unknown
// IDs costs one question to every node per ID and missTTL, not one per
// request).

// holderTimeout bounds a node's answer to whether it holds a sandbox: one
// that does not answer in time is taken not to.
const holderTimeout = 5 * time.Second

// missTTL is how long "no node holds it" stands for one key and ID: far
// below what a client waits between creating a sandbox on a node and
// using it through a gateway would matter for (IDs are random: an ID asked
// for before its sandbox existed is no client's pattern).
const missTTL = time.Second

// maxHolderAsks bounds the questions and misses kept: at the bound, the
// expired misses go, then any answered ones.
const maxHolderAsks = 4096

// sandboxID is what a sandbox ID may be (a Sandbox record's name, as the
// CRD has it): anything else no node holds, and is never put in a path.
var sandboxID = regexp.MustCompile(`^[a-z0-9]{1,63}$`)

// holderKey is whom a holder question is asked as, and about what.
type holderKey struct{ keyID, id string }

// holderAsk is one question to every node: in flight until done is
// closed, then its answer (a miss is kept for missTTL after answered).
type holderAsk struct {
	done     chan struct{}
	node     string
	found    bool
	answered time.Time
}

type holderAsks struct {
	mu   sync.Mutex
	asks map[holderKey]*holderAsk
}

// holder asks every live node whether it holds sandbox id, as the caller in
// ctx (a node answers 404 for another team's sandbox); sandbox traffic,
// which carries no key, asks as the cluster's admin, and the node's edge
// then checks the sandbox's own tokens as for any sandbox. It returns the
// name of the first node that does.
func (g *Gateway) holder(ctx context.Context, id string) (string, bool) {
	if !sandboxID.MatchString(id) {
		return "", false
	}
	keyID := store.AdminKeyID
	if p, ok := caller(ctx); ok {
		keyID = p.Key
	}
	k := holderKey{keyID: keyID, id: id}
	c := &g.holderAsks
	c.mu.Lock()
	a, shared := c.asks[k]
	if shared && !a.answered.IsZero() && time.Since(a.answered) >= missTTL {
		shared = false
	}
	if !shared {
		c.pruneLocked()
		a = &holderAsk{done: make(chan struct{})}
		c.asks[k] = a
	}
	c.mu.Unlock()
	if !shared {
		// Not the first caller's to cancel: the others wait on it.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), holderTimeout)
		node, found := g.askHolders(actx, keyID, id)
		cancel()
		c.mu.Lock()
		a.node, a.found, a.answered = node, found, time.Now()
		if found {
			delete(c.asks, k) // a yes is not kept: the record routes it soon
		}
		c.mu.Unlock()
		close(a.done)
	}
	select {
	case <-a.done:
	case <-ctx.Done():
		return "", false
	}
	if a.found && !shared {
		g.cfg.Log.Info("gateway: a sandbox without a record yet is on its node", "sandbox", id, "node", a.node)
	}
	return a.node, a.found
}

// pruneLocked makes room for one more question: the expired misses go,
// then, at the bound still, answered ones. c.mu is held.
func (c *holderAsks) pruneLocked() {
	if c.asks == nil {
		c.asks = map[holderKey]*holderAsk{}
	}
	if len(c.asks) < maxHolderAsks {
		return
	}
	for k, a := range c.asks {
		if !a.answered.IsZero() && time.Since(a.answered) >= missTTL {
			delete(c.asks, k)
		}
	}
	for k, a := range c.asks {
		if len(c.asks) < maxHolderAsks {
			return
		}
		if !a.answered.IsZero() {
			delete(c.asks, k)
		}
	}
}

// askHolders asks every live node for sandbox id (GET /sandboxes/{id},
// which changes nothing) as key keyID, and returns the first that has it.
func (g *Gateway) askHolders(ctx context.Context, keyID, id string) (string, bool) {
	nodes, err := g.nodes(ctx)
	if err != nil {
		return "", false
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the other nodes' questions end with the first yes
	found := make(chan string, len(nodes))
	done := eachLive(nodes, func(n cluster.NodeInfo) { // fanout.go
		if g.ask(ctx, nil, keyID, n, http.MethodGet, "/sandboxes/"+id, "", nil).status == http.StatusOK {
			found <- n.Name
		}
	})
	select {
	case name := <-found:
		return name, true
	case <-done:
		select { // the last node to answer may have said yes
		case name := <-found:
			return name, true
		default:
			return "", false
		}
	}
}
