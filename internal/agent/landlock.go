package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// ExecHelperCommand is the hidden subcommand of the cella binary that runs
// ExecHelperMain: `cella agent-exec <mode> <executable> <argv0> [args...]`.
const ExecHelperCommand = "agent-exec"

const (
	helperModeUser = "user"
	helperModeRoot = "root"
)

// privateRunDir is what no command may ever touch: the daemon's socket and
// the agent's config (which holds the channel and access tokens). A
// variable only so that tests can point it at a temporary directory.
var privateRunDir = "/run/cella"

// ExecHelperMain is the body of `cella agent-exec`. The agent starts every
// command through it when the sandbox runs on the namespaces runtime: it
// applies a Landlock ruleset to itself and then execs the command, so the
// ruleset is in force from the command's first instruction (Go cannot run
// code between fork and exec in the child). args are the arguments after
// the subcommand name: <mode> <executable> <argv0> [args...], mode "user"
// or "root". The environment, credentials, cwd and fds were already set up
// by the agent and pass through the exec unchanged.
//
// The ruleset is defence in depth under the namespaces runtime (gVisor
// needs none):
//   - user: read/execute everywhere, read/write under /home, /tmp,
//     /var/tmp and /dev;
//   - root: read/write everywhere;
//   - both: no file under /run/cella can be read. root's rights to make
//     and remove entries in / and /run reach into /run/cella as well
//     (Landlock grants whole trees and cannot carve one out); what keeps
//     root from changing it is its read-only mount (oci).
//
// Landlock is applied best-effort: on kernels without it the command runs
// unrestricted. Landlock sets no_new_privs, so setuid binaries (sudo) do
// not gain privileges in commands started this way.
//
// On success it does not return.
func ExecHelperMain(args []string) error {
	if len(args) < 3 {
		return fmt.Errorf("usage: %s <user|root> <executable> <argv0> [args...]", ExecHelperCommand)
	}
	mode, exe, argv := args[0], args[1], args[2:]
	if mode != helperModeUser && mode != helperModeRoot {
		return fmt.Errorf("%s: unknown mode %q", ExecHelperCommand, mode)
	}
	rules, err := landlockRules(mode, "/")
	if err != nil {
		return fmt.Errorf("%s: build landlock rules: %w", ExecHelperCommand, err)
	}
	if err := landlock.V6.BestEffort().RestrictPaths(rules...); err != nil {
		return fmt.Errorf("%s: apply landlock: %w", ExecHelperCommand, err)
	}
	err = syscall.Exec(exe, argv, os.Environ())
	return fmt.Errorf("%s: exec %s: %w", ExecHelperCommand, exe, err)
}

// landlockRules lists what a command may access. Landlock only allows, and
// a rule covers a whole tree, so "everything but /run/cella" is spelled as a
// rule per entry of / and of /run except cella. The ancestors of the private
// dir themselves (/ and /run) get every right but reading files, so that
// root can still create, write and remove entries directly in them (pid
// files in /run) while the private dir's files stay unreadable; those rights
// reach into the private dir too, whose read-only mount refuses them. root
// is a parameter for tests.
func landlockRules(mode, root string) ([]landlock.Rule, error) {
	private := filepath.Join(root, privateRunDir)
	isAncestor := func(p string) bool { return p == root || strings.HasPrefix(private, strings.TrimSuffix(p, "/")+"/") }
	var rw []string
	if mode == helperModeUser {
		for _, p := range []string{"/home", "/tmp", "/var/tmp", "/dev"} {
			rw = append(rw, filepath.Join(root, p))
		}
		if root == "/" {
			rw = append(rw, volumeMountPoints()...) // landlock_volumes.go
		}
	}
	var rules []landlock.Rule
	add := func(p string, write bool) {
		st, err := os.Stat(p) // follows /bin -> usr/bin and the like
		if err != nil {
			return
		}
		switch {
		case st.IsDir() && write:
			r := landlock.RWDirs(p).WithRefer().IgnoreIfMissing()
			if p == filepath.Join(root, "dev") {
				// Terminals need ioctls (window size, job control).
				r = r.WithIoctlDev()
			}
			rules = append(rules, r)
		case st.IsDir():
			rules = append(rules, landlock.RODirs(p).IgnoreIfMissing())
		case st.Mode().IsRegular() && write:
			rules = append(rules, landlock.RWFiles(p).IgnoreIfMissing())
		case st.Mode().IsRegular():
			rules = append(rules, landlock.ROFiles(p).IgnoreIfMissing())
		}
	}
	var walk func(dir string) error
	walk = func(dir string) error {
		if mode == helperModeRoot {
			rules = append(rules, landlock.PathAccess(ancestorRights, dir).IgnoreIfMissing())
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			switch {
			case p == private:
				continue
			case isAncestor(p):
				if err := walk(p); err != nil && !errors.Is(err, os.ErrNotExist) {
					return err
				}
			default:
				add(p, mode == helperModeRoot)
			}
		}
		return nil
	}
	if err := walk(root); err != nil {
		return nil, err
	}
	// Read/write areas nested in read-only ones (/var/tmp in /var) are
	// added on top: Landlock rights accumulate down the tree. An area that
	// contains the private dir is never granted whole.
	for _, p := range rw {
		if !isAncestor(p) {
			add(p, true)
		}
	}
	return rules, nil
}

// ancestorRights are root's rights on the directories above the private
// dir: everything but reading (and executing) files, which would reach into
// the private dir as well.
var ancestorRights = func() landlock.AccessFSSet {
	var all landlock.AccessFSSet
	for _, r := range []landlock.AccessFSSet{
		llsys.AccessFSWriteFile, llsys.AccessFSReadDir, llsys.AccessFSRemoveDir, llsys.AccessFSRemoveFile,
		llsys.AccessFSMakeChar, llsys.AccessFSMakeDir, llsys.AccessFSMakeReg, llsys.AccessFSMakeSock,
		llsys.AccessFSMakeFifo, llsys.AccessFSMakeBlock, llsys.AccessFSMakeSym, llsys.AccessFSRefer, llsys.AccessFSTruncate,
	} {
		all |= r
	}
	return all
}()
