package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/cella-sandbox/cella/internal/tenant"

	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/network"
	"github.com/cella-sandbox/cella/internal/store"
)

// Network gives sandboxes a way out: a network slot each (its own
// namespaces, internal/network) whose every connection and DNS query lands
// on the egress proxy, which applies the sandbox's policy.
type Network struct {
	Slots *network.Manager
	Proxy *egress.Proxy
	// CAPEM is the proxy's CA certificate, added to each sandbox's trust
	// store so that intercepted HTTPS (header injection) verifies.
	CAPEM []byte
	// Events receives every egress decision (the audit log).
	Events func(egress.Event)
	// Nameserver is the slots' host-side address, where the proxy's DNS
	// answers.
	Nameserver netip.Addr
}

// guestCAPath is the CA's own file inside a sandbox (NODE_EXTRA_CA_CERTS
// wants only the extra CA); the system bundle gets a copy appended.
const (
	guestCAPath     = "/etc/cella/egress-ca.pem"
	guestBundlePath = "/etc/ssl/certs/ca-certificates.crt"
)

// caEnv points the usual TLS stacks at the bundle that trusts the proxy's
// CA (curl, git, OpenSSL and Python's requests read the system bundle;
// pip and Node need telling).
func caEnv() map[string]string {
	return map[string]string{
		"SSL_CERT_FILE":       guestBundlePath,
		"REQUESTS_CA_BUNDLE":  guestBundlePath,
		"PIP_CERT":            guestBundlePath,
		"NODE_EXTRA_CA_CERTS": guestCAPath,
		"GIT_SSL_CAINFO":      guestBundlePath,
	}
}

// sandboxNet is a running sandbox's share of the network.
type sandboxNet struct {
	slot *network.Slot
	eg   *egress.Sandbox
}

// attachNetwork gives sb a fresh slot with the proxy serving it, and
// returns the namespace its container must join ("" without networking).
func (m *Manager) attachNetwork(ctx context.Context, sb *Sandbox) (string, error) {
	n := m.cfg.Network
	if n == nil {
		return "", nil
	}
	// A sandbox has one slot at most: a container it ran before (frozen,
	// then dropped by a resume without memory or an archive) is gone now.
	m.detachNetwork(sb)
	slot, err := n.Slots.Acquire(ctx)
	if err != nil {
		return "", fmt.Errorf("network slot for %s: %w", sb.ID, err)
	}
	if err := m.serveSlot(sb, slot); err != nil {
		return "", fmt.Errorf("egress policy of %s: %w", sb.ID, err)
	}
	return slot.NetNSPath, nil
}

// serveSlot has the proxy serve sb's slot under its egress policy and
// makes the slot sb's; on an invalid policy the slot is released.
func (m *Manager) serveSlot(sb *Sandbox, slot *network.Slot) error {
	n := m.cfg.Network
	eg := &egress.Sandbox{ID: sb.ID, Events: n.Events}
	if err := eg.SetPolicy(sb.Options.Egress); err != nil {
		_ = slot.Release()
		return err
	}
	go n.Proxy.Serve(slot.Listener, eg, network.OriginalDst)
	go n.Proxy.ServeDNS(slot.DNS, eg)
	sb.mu.Lock()
	sb.net = &sandboxNet{slot: slot, eg: eg}
	sb.mu.Unlock()
	return nil
}

// adoptNetwork gives a sandbox adopted after a daemon crash its network
// slot back: the slot survived with the container, the proxy's sockets
// did not. Without it the sandbox runs on with no way out (fail closed).
func (m *Manager) adoptNetwork(sb *Sandbox, slotID string) {
	n := m.cfg.Network
	if n == nil || slotID == "" {
		return
	}
	slot, err := n.Slots.Adopt(slotID)
	if err != nil {
		m.log.Warn("adopted sandbox keeps no egress: its network slot cannot be adopted", "id", sb.ID, "slot", slotID, "err", err)
		return
	}
	if err := m.serveSlot(sb, slot); err != nil {
		m.log.Warn("adopted sandbox keeps no egress: its recorded policy is invalid", "id", sb.ID, "err", err)
	}
}

// RecordedNetSlots returns the network slots that sandboxes recorded as
// running or paused in place use, for network.Config.Adoptable: a daemon
// starting after a crash must not reap them before Reconcile adopts them.
func RecordedNetSlots(ctx context.Context, st *store.Store) ([]string, error) {
	rows, err := st.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, row := range rows {
		var rec record
		if json.Unmarshal(row.Record, &rec) != nil || rec.NetSlot == "" {
			continue
		}
		if row.State == StateRunning || (row.State == StatePaused && rec.PauseMode == PauseFrozen) {
			ids = append(ids, rec.NetSlot)
		}
	}
	return ids, nil
}

// netNSPath is the namespace the container joins ("" = none).
func (s *Sandbox) netNSPath() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.net == nil {
		return ""
	}
	return s.net.slot.NetNSPath
}

// detachNetwork releases sb's slot: its proxy loops end and the kernel
// drops its namespaces once the container has let go of them.
func (m *Manager) detachNetwork(sb *Sandbox) {
	sb.mu.Lock()
	sn := sb.net
	sb.net = nil
	sb.mu.Unlock()
	if sn == nil {
		return
	}
	if err := sn.slot.Release(); err != nil {
		m.log.Warn("release network slot", "id", sb.ID, "err", err)
	}
}

// prepareGuestNetwork writes what programs inside need to use the network:
// the resolver (the slot's host side, answered by the proxy's DNS) and the
// proxy's CA in the trust store. Written into the sandbox's own layer, so
// the template is untouched and snapshots keep them.
func (m *Manager) prepareGuestNetwork(sb *Sandbox, root string) error {
	n := m.cfg.Network
	if n == nil {
		return nil
	}
	host := n.Nameserver
	if err := writeGuestFile(root, "/etc/resolv.conf", []byte("nameserver "+host.String()+"\noptions timeout:2 attempts:2\n"), 0o644); err != nil {
		return fmt.Errorf("resolver config for %s: %w", sb.ID, err)
	}
	if len(n.CAPEM) == 0 {
		return nil
	}
	if err := writeGuestFile(root, guestCAPath, n.CAPEM, 0o644); err != nil {
		return fmt.Errorf("egress CA for %s: %w", sb.ID, err)
	}
	bundle, err := readGuestFile(root, guestBundlePath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("trust store of %s: %w", sb.ID, err)
	}
	if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
		bundle = append(bundle, '\n')
	}
	bundle = append(bundle, n.CAPEM...)
	if err := writeGuestFile(root, guestBundlePath, bundle, 0o644); err != nil {
		return fmt.Errorf("trust store of %s: %w", sb.ID, err)
	}
	return nil
}

// writeGuestFile writes a file inside a sandbox root through os.Root, so a
// symlink the template holds cannot make the daemon write outside it; a
// symlink (or anything else) at the file itself is replaced, not followed.
func writeGuestFile(root, guestPath string, data []byte, mode os.FileMode) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return fmt.Errorf("open root %s: %w", root, err)
	}
	defer r.Close()
	rel := strings.TrimPrefix(filepath.Clean(guestPath), "/")
	if err := r.MkdirAll(filepath.Dir(rel), 0o755); err != nil {
		return fmt.Errorf("create the directory of %s: %w", guestPath, err)
	}
	if err := r.Remove(rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("replace %s: %w", guestPath, err)
	}
	if err := r.WriteFile(rel, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", guestPath, err)
	}
	return nil
}

// readGuestFile reads a file inside a sandbox root through os.Root. A
// symlink at the file reads as missing: it is replaced, not read through.
func readGuestFile(root, guestPath string) ([]byte, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", root, err)
	}
	defer r.Close()
	rel := strings.TrimPrefix(filepath.Clean(guestPath), "/")
	if st, err := r.Lstat(rel); err != nil {
		return nil, err
	} else if st.Mode()&fs.ModeSymlink != 0 {
		return nil, fs.ErrNotExist
	}
	return r.ReadFile(rel)
}

// SetNetwork replaces a running sandbox's egress policy; connections and
// queries that start afterwards see it (the proxy decides per connection,
// so no restart and no rule rewrite is needed).
func (m *Manager) SetNetwork(ctx context.Context, caller tenant.Principal, id string, p *egress.Policy, network json.RawMessage, allowInternet *bool) error {
	sb, err := m.Lookup(caller, id)
	if err != nil {
		return err
	}
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	sb.mu.Lock()
	sn := sb.net
	sb.Options.Egress = p
	sb.Options.Network = network
	sb.Options.AllowInternetAccess = allowInternet
	sb.mu.Unlock()
	if sn != nil {
		if err := sn.eg.SetPolicy(p); err != nil {
			return errdefs.InvalidArgument("network policy: %v", err)
		}
	}
	if err := m.persist(ctx, sb); err != nil {
		return fmt.Errorf("persist network policy of %s: %w", id, err)
	}
	m.log.Info("sandbox network policy updated", "id", id, "policy", egressSummary(p))
	m.lifecycleEvent(id, "egress policy updated: %s", egressSummary(p))
	m.emit(sb, EventUpdated, "network")
	return nil
}

func egressSummary(p *egress.Policy) string {
	if p == nil {
		return "allowed: nothing (no egress)"
	}
	return p.Summary()
}

// EgressPolicy is the policy in force for a sandbox (nil: no egress).
func (s *Sandbox) EgressPolicy() *egress.Policy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Options.Egress
}
