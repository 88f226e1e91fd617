package network

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrClosed is returned by Acquire after Close.
var ErrClosed = errors.New("network manager closed")

// lockName is the file in RunDir that one Manager holds locked, so that a
// second daemon (or test) cannot reap the namespaces of a running one.
const lockName = ".lock"

// Manager hands out slots, keeping up to PoolSize made in advance.
type Manager struct {
	cfg  Config
	log  *slog.Logger
	lock *os.File
	kick chan struct{}
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	pool   []*Slot // oldest first
	closed bool
	// adoptable are the slots left by a previous daemon that Adopt may
	// still hand out (Config.Adoptable, those whose files exist).
	adoptable map[string]bool
}

// New validates cfg, takes RunDir for itself, reaps what a previous daemon
// left there, makes one slot to prove the kernel supports all of it, and
// starts filling the pool in the background.
func New(cfg Config, log *slog.Logger) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.RunDir, 0o755); err != nil {
		return nil, fmt.Errorf("network run dir: %w", err)
	}
	lock, err := lockRunDir(cfg.RunDir)
	if err != nil {
		return nil, err
	}
	adoptable := map[string]bool{}
	for _, id := range cfg.Adoptable {
		if slotFilesExist(cfg.RunDir, id) {
			adoptable[id] = true
		}
	}
	n, err := reap(cfg.RunDir, adoptable)
	if err != nil {
		_ = lock.Close()
		return nil, err
	}
	if n > 0 {
		log.Info("removed leftover network namespaces", "count", n, "dir", cfg.RunDir)
	}
	m := &Manager{
		cfg: cfg, log: log, lock: lock,
		kick:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
		adoptable: adoptable,
	}
	// Making a slot now turns a kernel without veth, nf_tables or NAT (or a
	// daemon without CAP_NET_ADMIN/CAP_SYS_ADMIN) into a startup error
	// rather than a failure of the first sandbox.
	s, err := m.newSlot()
	if err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("network slots not supported here: %w", err)
	}
	log.Info("network slots available", "setup", s.SetupTime(), "prefix", cfg.Prefix, "pool", cfg.PoolSize)
	if cfg.PoolSize > 0 {
		m.pool = append(m.pool, s)
	} else if err := s.Release(); err != nil {
		_ = lock.Close()
		return nil, err
	}
	go m.refill()
	m.wake()
	return m, nil
}

// Acquire returns a slot nobody has used, from the pool if one is ready,
// else made on the spot. The caller owns it and must Release it.
func (m *Manager) Acquire(ctx context.Context) (*Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	var s *Slot
	if len(m.pool) > 0 {
		s = m.pool[0]
		m.pool = m.pool[1:]
	}
	m.mu.Unlock()
	m.wake()
	if s != nil {
		return s, nil
	}
	type made struct {
		s   *Slot
		err error
	}
	ch := make(chan made, 1)
	go func() {
		s, err := m.newSlot()
		ch <- made{s, err}
	}()
	select {
	case r := <-ch:
		return r.s, r.err
	case <-ctx.Done():
		// Creation cannot be interrupted halfway; discard the slot when it
		// is done so nothing leaks.
		go func() {
			if r := <-ch; r.s != nil {
				_ = r.s.Release()
			}
		}()
		return nil, ctx.Err()
	}
}

// Close stops refilling and releases pooled slots. Slots already acquired
// stay valid; their owners release them.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	pool := m.pool
	m.pool = nil
	m.mu.Unlock()
	close(m.stop)
	<-m.done
	var errs []error
	for _, s := range pool {
		errs = append(errs, s.Release())
	}
	errs = append(errs, m.lock.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close network manager: %w", err)
	}
	return nil
}

func (m *Manager) newSlot() (*Slot, error) {
	id, err := newID()
	if err != nil {
		return nil, err
	}
	s, err := makeSlot(&m.cfg, id)
	if err != nil {
		return nil, err
	}
	m.log.Debug("made network slot", "id", id, "setup", s.SetupTime())
	return s, nil
}

func (m *Manager) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// refill tops the pool up whenever Acquire takes from it. Failures back off
// instead of spinning: Acquire still works (it makes slots itself) and will
// report the error to its caller.
func (m *Manager) refill() {
	defer close(m.done)
	const minBackoff, maxBackoff = 100 * time.Millisecond, 30 * time.Second
	backoff := minBackoff
	for {
		select {
		case <-m.stop:
			return
		case <-m.kick:
		}
		for {
			m.mu.Lock()
			need := !m.closed && len(m.pool) < m.cfg.PoolSize
			m.mu.Unlock()
			if !need {
				break
			}
			s, err := m.newSlot()
			if err != nil {
				m.log.Warn("refill network slot pool", "err", err, "retry", backoff)
				select {
				case <-m.stop:
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, maxBackoff)
				continue
			}
			backoff = minBackoff
			m.mu.Lock()
			if m.closed {
				m.mu.Unlock()
				_ = s.Release()
				return
			}
			m.pool = append(m.pool, s)
			m.mu.Unlock()
		}
	}
}

// newID returns a random slot id. Random rather than a counter so that ids
// never repeat across daemon restarts, when leftovers may still exist.
func newID() (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("slot id: %w", err)
	}
	return "n" + hex.EncodeToString(b[:]), nil
}

// Reap removes every namespace file left in runDir by a daemon that did not
// release its slots (a crash), and returns how many files it removed. It
// fails if a Manager is using runDir; New reaps by itself.
func Reap(runDir string) (int, error) {
	if _, err := os.Stat(runDir); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	lock, err := lockRunDir(runDir)
	if err != nil {
		return 0, err
	}
	defer lock.Close()
	return reap(runDir, nil)
}

// reap removes the namespace files in dir except those of the slots in keep.
func reap(dir string, keep map[string]bool) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("reap network namespaces: %w", err)
	}
	var paths []string
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, innerSuffix) && !strings.HasSuffix(name, outerSuffix) {
			continue
		}
		if keep[name[:len(name)-2]] {
			continue
		}
		paths = append(paths, filepath.Join(dir, name))
	}
	n, err := removeNSFiles(paths)
	if err != nil {
		return n, fmt.Errorf("reap network namespaces: %w", err)
	}
	return n, nil
}

// removeNSFiles removes namespace files and returns how many went.
func removeNSFiles(paths []string) (int, error) {
	var n int
	var errs []error
	for _, p := range paths {
		if err := removeNSFile(p); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

func lockRunDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock network run dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("network run dir %s is in use by another manager", dir)
		}
		return nil, fmt.Errorf("lock network run dir: %w", err)
	}
	return f, nil
}

// Adopt hands out a slot a previous daemon made and a sandbox still runs
// in (one of Config.Adoptable): its namespaces, veth and rules survived the
// daemon, its sockets did not, so they are opened again in its outer
// namespace. The caller owns the slot and must Release it.
func (m *Manager) Adopt(id string) (*Slot, error) {
	m.mu.Lock()
	ok := m.adoptable[id] && !m.closed
	delete(m.adoptable, id)
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("network slot %s: not left by a previous daemon, or already adopted", id)
	}
	s, err := adoptSlot(&m.cfg, id)
	if err != nil {
		m.mu.Lock()
		m.adoptable[id] = true // its files are left for ReapUnadopted
		m.mu.Unlock()
		return nil, err
	}
	m.log.Info("adopted network slot", "id", id)
	return s, nil
}

// ReapUnadopted removes the slots left by a previous daemon that were not
// adopted (their sandboxes were gone), and returns how many it removed.
func (m *Manager) ReapUnadopted() (int, error) {
	m.mu.Lock()
	left := m.adoptable
	m.adoptable = map[string]bool{}
	m.mu.Unlock()
	var paths []string
	for id := range left {
		inner, outer := nsPaths(m.cfg.RunDir, id)
		paths = append(paths, inner, outer)
	}
	n, err := removeNSFiles(paths)
	if err != nil {
		return n, fmt.Errorf("reap unadopted network slots: %w", err)
	}
	return n, nil
}

func slotFilesExist(runDir, id string) bool {
	if !slotIDRE.MatchString(id) {
		return false
	}
	inner, outer := nsPaths(runDir, id)
	for _, p := range []string{inner, outer} {
		if _, err := os.Stat(p); err != nil {
			return false
		}
	}
	return true
}
