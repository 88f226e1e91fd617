package cluster_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/quota"
)

// TestAliasReservation: of many teams reserving one alias at once exactly
// one gets it (the rest a conflict in E2B's words); many requests of one
// team at once all get the one template ID the first reserved; a deleted
// template's alias is free again.
func TestAliasReservation(t *testing.T) {
	c, ns := env(t)
	ctx := ctxT(t)
	r := cluster.NewRecords(c, ns)
	for round := range 5 {
		alias := fmt.Sprintf("contested-%d", round)
		const n = 8
		ids, errs := make([]string, n), make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ids[i], errs[i] = r.ReserveAlias(ctx, alias, fmt.Sprintf("team-%d", i), fmt.Sprintf("tpl%d%d", round, i))
			}()
		}
		close(start)
		wg.Wait()
		won := 0
		for i, err := range errs {
			switch {
			case err == nil:
				won++
				if ids[i] != fmt.Sprintf("tpl%d%d", round, i) {
					t.Errorf("round %d: team-%d got the alias for %q", round, i, ids[i])
				}
			case !errdefs.Is(err, errdefs.KindConflict) || err.Error() != fmt.Sprintf("Alias '%s' is already used by another team", alias):
				t.Errorf("round %d: team-%d: %v", round, i, err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d teams got alias %s, want 1: %v", round, won, alias, errs)
		}
	}

	// One team, many requests: one ID.
	const n = 6
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := r.ReserveAlias(ctx, "shared", "team-a", fmt.Sprintf("own%d", i))
			if err != nil {
				t.Errorf("request %d: %v", i, err)
			}
			ids[i] = id
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("one team's concurrent requests got different templates for one alias: %v", ids)
		}
	}

	// Released with its template's record.
	if _, err := r.EditTemplate(ctx, ids[0], func(tp *v1alpha1.Template) error {
		tp.Spec.Team, tp.Spec.Aliases = "team-a", []string{"shared"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReserveAlias(ctx, "shared", "team-b", "theirs"); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("another team took a recorded alias: %v", err)
	}
	tp, err := r.Template(ctx, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := r.DeleteTemplate(ctx, tp); err != nil {
		t.Fatal(err)
	}
	if id, err := r.ReserveAlias(ctx, "shared", "team-b", "theirs"); err != nil || id != "theirs" {
		t.Fatalf("the deleted template's alias: %q %v", id, err)
	}
}

// TestKeyUsageHold: two nodes claiming a key's slots at once, each one
// claim at a time as a node's manager does, never pass its limit
// together; a node that leaves (its Lease deleted) stops counting.
func TestKeyUsageHold(t *testing.T) {
	c, ns := env(t)
	ctx := ctxT(t)
	var leases []*cluster.Node
	for _, name := range []string{"node-a", "node-b"} {
		node, err := cluster.Join(ctx, cluster.NodeConfig{Client: c, Namespace: ns, Name: name, Endpoint: "http://127.0.0.1:1/" + name, Duration: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { node.Close() })
		leases = append(leases, node)
	}
	const limit, tries = 5, 12
	type node struct {
		u    *cluster.KeyUsages
		mu   sync.Mutex
		held int
	}
	nodes := []*node{{u: cluster.NewKeyUsages(c, ns, "node-a")}, {u: cluster.NewKeyUsages(c, ns, "node-b")}}
	claim := func(n *node) error {
		n.mu.Lock()
		defer n.mu.Unlock()
		err := n.u.Hold(ctx, "key-1", quota.Usage{Sandboxes: n.held + 1}, func(others quota.Usage) error {
			if others.Sandboxes+n.held+1 > limit {
				return errdefs.ResourceExhausted("full")
			}
			return nil
		})
		if err == nil {
			n.held++
		}
		return err
	}
	var wg sync.WaitGroup
	for i := range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := claim(nodes[i%2]); err != nil && !errdefs.Is(err, errdefs.KindResourceExhausted) {
				t.Errorf("claim %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if got := nodes[0].held + nodes[1].held; got != limit {
		t.Fatalf("%d + %d slots held, want %d in all", nodes[0].held, nodes[1].held, limit)
	}
	others, err := nodes[0].u.Others(ctx, "key-1")
	if err != nil || others.Sandboxes != nodes[1].held {
		t.Fatalf("node-a sees %+v on the others, want %d: %v", others, nodes[1].held, err)
	}
	held, err := nodes[1].u.Held(ctx)
	if err != nil || held["key-1"].Sandboxes != nodes[1].held {
		t.Fatalf("node-b's entries: %+v %v", held, err)
	}
	// node-b gives back one of its slots: node-a may take it.
	nodes[1].mu.Lock()
	nodes[1].held--
	if err := nodes[1].u.Hold(ctx, "key-1", quota.Usage{Sandboxes: nodes[1].held}, nil); err != nil {
		t.Fatal(err)
	}
	nodes[1].mu.Unlock()
	if err := claim(nodes[0]); err != nil {
		t.Fatalf("the slot node-b gave back: %v", err)
	}
	if err := claim(nodes[0]); !errdefs.Is(err, errdefs.KindResourceExhausted) {
		t.Fatalf("one past the limit: %v", err)
	}
	// Every field comes back as written (the schema prunes what it lacks).
	sized := quota.Usage{Sandboxes: 2, CPUs: 1.5, MemoryMB: 768}
	if err := nodes[1].u.Hold(ctx, "key-2", sized, nil); err != nil {
		t.Fatal(err)
	}
	if held, err := nodes[1].u.Held(ctx); err != nil || held["key-2"] != sized {
		t.Fatalf("key-2 came back as %+v, want %+v: %v", held["key-2"], sized, err)
	}
	// node-b leaves: its slots no longer count.
	leases[1].Close()
	for nodes[0].held < limit {
		if err := claim(nodes[0]); err != nil {
			t.Fatalf("node-a's claim %d with node-b gone: %v", nodes[0].held+1, err)
		}
	}
	if err := claim(nodes[0]); !errdefs.Is(err, errdefs.KindResourceExhausted) {
		t.Fatalf("one past the limit on node-a alone: %v", err)
	}
}
