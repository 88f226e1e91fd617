package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/agent/asuser"
)

// sandboxUser is an account of the sandbox's own user database. The agent
// parses /etc/passwd and /etc/group itself instead of using os/user: the
// agent is a static binary (no NSS), and the files are read again whenever
// they changed, so that accounts created inside the sandbox (useradd) just
// work.
type sandboxUser struct {
	Name   string
	UID    uint32
	GID    uint32
	Home   string
	Groups []uint32 // supplementary groups, including the primary one
}

// do runs fn with u's identity (asuser.Run): every path fn touches is
// resolved and permission-checked by the kernel as u, symlinks included,
// and what fn creates is owned by u. The file APIs do all their filesystem
// work through it, so a request can do what u could do in a shell and no
// more, and never changes the owner of a file it did not create.
func (u *sandboxUser) do(fn func() error) error {
	return asuser.Run(asuser.Identity{UID: u.UID, GID: u.GID, Groups: u.Groups}, fn)
}

// denied rewords a permission error of u's so that it names the user: the
// kernel's "permission denied" alone does not say that the request was
// checked as someone other than root.
func (u *sandboxUser) denied(op, path string, err error) error {
	if !errors.Is(err, fs.ErrPermission) {
		return err
	}
	return fmt.Errorf("permission denied: user '%s' cannot %s '%s': %w", u.Name, op, path, err)
}

// userDB reads the sandbox's passwd and group files.
type userDB struct {
	passwdPath string
	groupPath  string
	// cache (nil: none) keeps the users looked up while both files stay
	// as they were: every exec and file request looks its user up, and
	// reading and parsing both files each time was 2.4 % of the agent's
	// CPU per exec under the namespaces runtime, profiled.
	cache *userCache
}

func newUserDB(passwdPath, groupPath string) userDB {
	return userDB{passwdPath: passwdPath, groupPath: groupPath, cache: &userCache{}}
}

// userCache holds users of one version of the files: the stamps of both,
// taken before they were read.
type userCache struct {
	mu     sync.Mutex
	stamps [2]fileStamp
	users  map[string]sandboxUser
}

// fileStamp tells versions of a file apart: useradd and its kin write a
// new file and rename it over the old one (another inode), an editor may
// write in place (another mtime, ctime or size; user space can set a
// file's mtime back, never its ctime).
type fileStamp struct {
	ok                 bool
	dev, ino           uint64
	size, mtime, ctime int64
}

func stampOf(path string) fileStamp {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileStamp{}
	}
	return fileStamp{ok: true, dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}
}

// racy reports whether the file changed so recently that another change
// within the same clock tick could leave its stamp as it is (git's "racy"
// rule): such a version is read every time until it has aged. A ctime in
// whole seconds is of a file system that keeps no finer time (ext4 with
// 128-byte inodes, and others): its tick is a second.
func (f fileStamp) racy(now time.Time) bool {
	window := racyWindow
	if f.ctime%int64(time.Second) == 0 {
		window = max(window, coarseRacyWindow)
	}
	return now.UnixNano()-max(f.mtime, f.ctime) < window.Nanoseconds()
}

// racyWindow is well over a filesystem clock tick (1-10 ms on kernels
// without fine-grained timestamps), coarseRacyWindow over a second;
// variables for tests.
var (
	racyWindow       = 100 * time.Millisecond
	coarseRacyWindow = 2 * time.Second
)

// lookup finds a user by name. A numeric name that is not in passwd is
// accepted as a bare uid (gid = uid, home = /) so that images without an
// entry for the uid still work. Accounts created inside the sandbox
// (useradd) are found at once: the files are read again whenever either
// changed.
func (db userDB) lookup(name string) (*sandboxUser, error) {
	if name == "" {
		return nil, fmt.Errorf("no user given")
	}
	if db.cache == nil {
		return db.read(name)
	}
	stamps := [2]fileStamp{stampOf(db.passwdPath), stampOf(db.groupPath)}
	if now := time.Now(); stamps[0].racy(now) || stamps[1].racy(now) {
		return db.read(name)
	}
	c := db.cache
	c.mu.Lock()
	if stamps != c.stamps {
		c.stamps, c.users = stamps, map[string]sandboxUser{}
	}
	if u, ok := c.users[name]; ok {
		c.mu.Unlock()
		u.Groups = slices.Clone(u.Groups)
		return &u, nil
	}
	c.mu.Unlock()
	u, err := db.read(name)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.stamps == stamps && stamps[0].ok {
		kept := *u
		kept.Groups = slices.Clone(u.Groups)
		c.users[name] = kept
	}
	c.mu.Unlock()
	return u, nil
}

// read looks name up in the files as they are now.
func (db userDB) read(name string) (*sandboxUser, error) {
	var found *sandboxUser
	err := scanColonFile(db.passwdPath, func(f []string) bool {
		if len(f) < 7 || f[0] != name {
			return true
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return true
		}
		found = &sandboxUser{Name: f[0], UID: uint32(uid), GID: uint32(gid), Home: f[5]}
		return false
	})
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("read %s: %w", db.passwdPath, err)
	}
	if found == nil {
		if name == "root" {
			found = &sandboxUser{Name: "root", Home: "/root"}
		} else {
			return nil, fmt.Errorf("user '%s' does not exist in the sandbox", name)
		}
	}
	if found.Home == "" {
		found.Home = "/"
	}
	found.Groups = db.groupsOf(found.Name, found.GID)
	return found, nil
}

// groupsOf lists the supplementary groups of a user (the primary gid first).
func (db userDB) groupsOf(name string, primary uint32) []uint32 {
	groups := []uint32{primary}
	_ = scanColonFile(db.groupPath, func(f []string) bool {
		if len(f) < 4 || f[3] == "" {
			return true
		}
		for _, m := range strings.Split(f[3], ",") {
			if m != name {
				continue
			}
			if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil && uint32(gid) != primary {
				groups = append(groups, uint32(gid))
			}
			break
		}
		return true
	})
	return groups
}

// names maps uids and gids to names for EntryInfo.owner/group. Unknown ids
// are returned as numbers, like envd.
type idNames struct {
	users  map[uint32]string
	groups map[uint32]string
}

func (db userDB) idNames() idNames {
	n := idNames{users: map[uint32]string{}, groups: map[uint32]string{}}
	_ = scanColonFile(db.passwdPath, func(f []string) bool {
		if len(f) >= 3 {
			if id, err := strconv.ParseUint(f[2], 10, 32); err == nil {
				if _, dup := n.users[uint32(id)]; !dup {
					n.users[uint32(id)] = f[0]
				}
			}
		}
		return true
	})
	_ = scanColonFile(db.groupPath, func(f []string) bool {
		if len(f) >= 3 {
			if id, err := strconv.ParseUint(f[2], 10, 32); err == nil {
				if _, dup := n.groups[uint32(id)]; !dup {
					n.groups[uint32(id)] = f[0]
				}
			}
		}
		return true
	})
	return n
}

func (n idNames) user(uid uint32) string {
	if s, ok := n.users[uid]; ok {
		return s
	}
	return strconv.FormatUint(uint64(uid), 10)
}

func (n idNames) group(gid uint32) string {
	if s, ok := n.groups[gid]; ok {
		return s
	}
	return strconv.FormatUint(uint64(gid), 10)
}

// scanColonFile calls fn with the fields of every non-comment line until fn
// returns false.
func scanColonFile(path string, fn func([]string) bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20) // grows from 4 KiB as lines need

	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if !fn(strings.Split(line, ":")) {
			return nil
		}
	}
	return sc.Err()
}
