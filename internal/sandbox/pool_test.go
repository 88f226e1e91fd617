package sandbox

import (
	"errors"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/egress"
)

// The end-to-end warm-pool test with real gVisor sandboxes is
// internal/api's TestPool; these check the pool's bookkeeping alone.

func TestPoolCannotServe(t *testing.T) {
	base, err := poolBase("base", testMaxima)
	if err != nil {
		t.Fatal(err)
	}
	p := &pool{template: "base", size: 2, base: base}
	req := func(f func(o *Options)) Options {
		o := Options{TemplateID: "base"}
		f(&o)
		if err := o.Normalize(testMaxima); err != nil {
			t.Fatal(err)
		}
		return o
	}
	// What hand-out applies does not matter.
	served := req(func(o *Options) {
		o.Timeout = time.Hour
		o.EnvVars = map[string]string{"A": "b"}
		o.Metadata = map[string]string{"k": "v"}
		o.Egress = &egress.Policy{AllowOut: []string{"example.com"}}
		o.AutoPause = true
		o.Lifecycle = Lifecycle{AutoStop: time.Minute}
		o.APIKeyID = "someone"
		o.MemoryMB = DefaultMemoryMB // the default, spelled out
	})
	if why := p.cannotServe(served); why != "" {
		t.Fatalf("pool refuses options it can serve: %s", why)
	}
	for want, f := range map[string]func(o *Options){
		"cpus":          func(o *Options) { o.CPUs = 2 },
		"memory":        func(o *Options) { o.MemoryMB = 1024 },
		"disk":          func(o *Options) { o.DiskMB = 2048 },
		"pids":          func(o *Options) { o.Pids = 300 },
		"output limit":  func(o *Options) { o.OutputMB = 20 },
		"volume mounts": func(o *Options) { o.Volumes = []VolumeMount{{Name: "v", Path: "/data"}} },
	} {
		if why := p.cannotServe(req(f)); why != want {
			t.Errorf("cannotServe = %q, want %q", why, want)
		}
	}
}

func TestPoolFillBookkeeping(t *testing.T) {
	base, _ := poolBase("base", testMaxima)
	ps := &poolSet{byTpl: map[string]*pool{}}
	p := &pool{template: "base", size: 2, base: base}
	ps.byTpl["base"] = p
	now := time.Now()

	got, _ := ps.next(now)
	if got != p || p.filling != 1 {
		t.Fatalf("next: %v filling %d", got, p.filling)
	}
	// A fill in progress counts toward the size.
	p.size = 1
	if got, _ := ps.next(now); got != nil {
		t.Fatal("next picked a pool whose fill in progress makes it full")
	}
	p.size = 2

	// A failed fill backs off and says why.
	ps.put(p, nil, errors.New("boom"), false)
	if p.filling != 0 || p.lastErr != "boom" || !p.retryAt.After(now) {
		t.Fatalf("after a failed fill: %+v", p)
	}
	if got, wait := ps.next(time.Now()); got != nil || wait <= 0 || wait > time.Second {
		t.Fatalf("next during backoff: %v, wait %v", got, wait)
	}
	// A fill abandoned at shutdown is not an error.
	p.retryAt = time.Time{}
	ps.next(time.Now())
	ps.put(p, nil, errors.New("context canceled"), true)
	if p.lastErr != "boom" || p.failures != 1 {
		t.Fatalf("abandoned fill counted as a failure: %+v", p)
	}

	// A good fill joins the pool and clears the error.
	got, _ = ps.next(time.Now())
	pd := &pooled{sb: &Sandbox{ID: "a"}}
	if d := ps.put(got, pd, nil, false); d != nil || len(p.ready) != 1 || p.lastErr != "" || p.failures != 0 {
		t.Fatalf("after a good fill: discard %v, %+v", d, p)
	}
	// A fill the pool no longer wants (resized to 0 meanwhile) comes back
	// to be destroyed.
	got, _ = ps.next(time.Now())
	delete(ps.byTpl, "base")
	pd2 := &pooled{sb: &Sandbox{ID: "b"}}
	if d := ps.put(got, pd2, nil, false); d != pd2 {
		t.Fatalf("fill of a removed pool kept: %v", d)
	}
	if st := (&Manager{}).Pools(); len(st) != 0 {
		t.Fatalf("pools of a fresh manager: %+v", st)
	}
}

func TestPoolCreatingCounter(t *testing.T) {
	var ps poolSet
	end1, end2 := ps.creating(), ps.creating()
	if ps.creates.Load() != 2 {
		t.Fatal("creates not counted")
	}
	end1()
	end2()
	if ps.creates.Load() != 0 {
		t.Fatal("creates not uncounted")
	}
}
