package codeinterp

import (
	"bufio"
	"bytes"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

//go:embed drivers/charts.py
var chartsDriver string

//go:embed drivers/python.py
var pythonDriver string

//go:embed drivers/node.js
var nodeDriver string

//go:embed drivers/bash.sh
var bashDriver string

//go:embed drivers/r.R
var rDriver string

// language is how to start the interpreter of one language. The driver's
// source is passed on the command line (-c / -e), so nothing is written
// into the sandbox.
type language struct {
	name string
	exes []string // looked up on the interpreter's PATH, first found wins
	argv func(exe string) []string
	env  []string // added to the interpreter's environment
	// needs are other executables the driver runs (looked up like exes).
	needs []string
	// nulFramed: cells go to fd 3 as NUL-terminated scripts rather than
	// JSON lines (the bash driver cannot parse JSON).
	nulFramed bool
	// interruptGroup sends the interrupt to the driver's whole process
	// group: bash leaves its foreground command to the signal.
	interruptGroup bool
	// what to install when the interpreter is missing, for the error
	missing string
}

var languages = map[string]*language{
	"python": {
		name: "python",
		exes: []string{"python3", "python"},
		// charts.py first: the driver's e2b/chart formatter calls it.
		argv:    func(exe string) []string { return []string{exe, "-c", chartsDriver + "\n" + pythonDriver} },
		missing: "python3 with IPython (Debian: python3-ipython) is not installed in this sandbox's template",
	},
	"javascript": {
		name:    "javascript",
		exes:    []string{"node", "nodejs"},
		argv:    func(exe string) []string { return []string{exe, "-e", nodeDriver} },
		missing: "node is not installed in this sandbox's template",
	},
	"typescript": {
		name: "typescript",
		exes: []string{"node", "nodejs"},
		// The Node driver strips the cell's types with esbuild first.
		argv:    func(exe string) []string { return []string{exe, "-e", nodeDriver} },
		env:     []string{"CELLA_CI_TYPESCRIPT=1"},
		needs:   []string{"esbuild"},
		missing: "node and esbuild (Debian: nodejs, esbuild) are not installed in this sandbox's template",
	},
	"r": {
		name:    "r",
		exes:    []string{"Rscript"},
		argv:    func(exe string) []string { return []string{exe, "--no-save", "--no-restore", "-e", rDriver} },
		missing: "R with the evaluate, repr and jsonlite packages (Debian: r-base-core, r-cran-irkernel) is not installed in this sandbox's template",
	},
	"bash": {
		name:           "bash",
		exes:           []string{"bash"},
		argv:           func(exe string) []string { return []string{exe, "--noprofile", "--norc", "-c", bashDriver, "bash"} },
		nulFramed:      true,
		interruptGroup: true,
		missing:        "bash is not installed in this sandbox's template",
	},
}

// aliases are the other names clients use for the supported languages.
var aliases = map[string]string{
	"":        "python",
	"python3": "python",
	"py":      "python",
	"js":      "javascript",
	"node":    "javascript",
	"nodejs":  "javascript",
	"ts":      "typescript",
	"sh":      "bash",
}

func lookupLanguage(name string) (*language, bool) {
	n := strings.ToLower(strings.TrimSpace(name))
	if a, ok := aliases[n]; ok {
		n = a
	}
	l, ok := languages[n]
	return l, ok
}

// Proc is a driver process to start. Files become the child's fds 0..n.
type Proc struct {
	Argv  []string // Argv[0] is an absolute path
	Env   []string
	Dir   string
	Files []*os.File
}

// Spawner starts p in a session of its own and returns its pid and a
// channel that receives its wait status. Inside a sandbox the agent's
// spawner forks through the PID-1 reaper (the only waiter there) as the
// sandbox user; LocalSpawner is for tests.
type Spawner func(p Proc) (pid int, wait <-chan unix.WaitStatus, err error)

// LocalSpawner forks p as the current user and waits for it by pid.
func LocalSpawner(p Proc) (int, <-chan unix.WaitStatus, error) { return localSpawn(p, nil) }

// localSpawn forks p, as cred's user if cred is set, and waits for it.
func localSpawn(p Proc, cred *syscall.Credential) (int, <-chan unix.WaitStatus, error) {
	fds := make([]uintptr, len(p.Files))
	for i, f := range p.Files {
		fds[i] = f.Fd()
	}
	pid, err := syscall.ForkExec(p.Argv[0], p.Argv, &syscall.ProcAttr{
		Dir: p.Dir, Env: p.Env, Files: fds, Sys: &syscall.SysProcAttr{Setsid: true, Credential: cred},
	})
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	go func() {
		for {
			var ws unix.WaitStatus
			_, err := unix.Wait4(pid, &ws, 0, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				ws = unix.WaitStatus(unix.SIGKILL)
			}
			ch <- ws
			return
		}
	}()
	return pid, ch, nil
}

// Output kinds of a chunk.
const (
	kindStdout = "stdout"
	kindStderr = "stderr"
)

// chunk is output of the driver's fd 1 or 2, or the end-of-cell marker.
type chunk struct {
	kind string
	text string
	mark bool
}

// event is one line the driver writes on fd 4.
type event struct {
	Type      string                     `json:"type"`
	Main      bool                       `json:"main"`
	Data      map[string]json.RawMessage `json:"data"`
	Name      string                     `json:"name"`
	Value     string                     `json:"value"`
	Traceback string                     `json:"traceback"`
}

// sink is where a driver's output goes while a cell runs.
type sink struct {
	ch   chan chunk
	done chan struct{} // closed when the execution stops reading
}

// driver is one running interpreter process.
type driver struct {
	lang *language
	pid  int
	// env is the environment it started with; its first cell brings it
	// up to date (a driver started at boot predates the sandbox's env
	// vars, as E2B's kernels do, which load them on the first execution).
	env    []string
	synced bool // under the kernel's sem
	cmdW   *os.File
	events chan event    // closed when fd 4 reaches EOF (the driver exited)
	exited chan struct{} // closed once the wait status is in status
	status unix.WaitStatus

	mu         sync.Mutex
	sink       *sink
	stderrTail []byte // the end of stderr, for errors about a driver that failed to start
}

const stderrTailMax = 2048

// startDriver starts the interpreter of lang in dir and waits until it is
// ready for commands.
func startDriver(lang *language, env []string, dir string, spawn Spawner, readyTimeout time.Duration) (*driver, error) {
	exe, err := findExe(lang.exes, env)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", lang.missing, err)
	}
	for _, n := range lang.needs {
		if _, err := findExe([]string{n}, env); err != nil {
			return nil, fmt.Errorf("%s: %w", lang.missing, err)
		}
	}
	env = append(slices.Clone(env), lang.env...)
	// The marker has NULs so that no text output contains it by chance; the
	// environment cannot carry NULs, so the driver gets only its nonce.
	nonce := randomHex(8)
	mark := "\x00cella-cell-end-" + nonce + "\x00"
	env = append(env, "CELLA_CI_MARK="+nonce)

	var parent, child []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		if err != nil {
			return nil, nil, fmt.Errorf("pipe for the %s driver: %w", lang.name, err)
		}
		return r, w, nil
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", os.DevNull, err)
	}
	child = append(child, devnull)
	var pipes [4][2]*os.File // stdout, stderr, commands, events
	for i := range pipes {
		r, w, err := pipe()
		if err != nil {
			closeAll(child)
			closeAll(parent)
			return nil, err
		}
		pipes[i] = [2]*os.File{r, w}
		if i == 2 { // commands: the child reads
			child, parent = append(child, r), append(parent, w)
		} else {
			child, parent = append(child, w), append(parent, r)
		}
	}
	// fds: 0 /dev/null, 1 stdout, 2 stderr, 3 commands, 4 events
	files := []*os.File{devnull, pipes[0][1], pipes[1][1], pipes[2][0], pipes[3][1]}
	pid, wait, err := spawn(Proc{Argv: lang.argv(exe), Env: env, Dir: dir, Files: files})
	closeAll(child)
	if errors.Is(err, unix.EACCES) {
		// The interpreter is executable (findExe checked), so it is the
		// sandbox user who may not enter dir: the child chdirs after
		// dropping to the user's uid.
		closeAll(parent)
		return nil, fmt.Errorf("cwd %s: %w (%w)", dir, errCwdDenied, err)
	}
	if err != nil {
		closeAll(parent)
		return nil, fmt.Errorf("start the %s interpreter %s: %w", lang.name, exe, err)
	}
	d := &driver{
		lang:   lang,
		env:    env,
		pid:    pid,
		cmdW:   pipes[2][1],
		events: make(chan event, 16),
		exited: make(chan struct{}),
	}
	go func() {
		d.status = <-wait
		close(d.exited)
	}()
	go d.readOutput(pipes[0][0], kindStdout, []byte(mark))
	go d.readOutput(pipes[1][0], kindStderr, []byte(mark))
	go d.readEvents(pipes[3][0])

	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case ev, ok := <-d.events:
		if ok && ev.Type == "ready" {
			return d, nil
		}
		d.kill()
		d.waitExit()
		return nil, fmt.Errorf("the %s interpreter exited at start (%s): %s", lang.name, describeStatus(d.status), d.tail())
	case <-timer.C:
		d.kill()
		return nil, fmt.Errorf("the %s interpreter did not start within %v: %s", lang.name, readyTimeout, d.tail())
	}
}

func (d *driver) tail() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := strings.TrimSpace(string(d.stderrTail))
	if s == "" {
		return "no output on stderr"
	}
	return "stderr: " + s
}

// kill ends the driver and everything it started (its session).
func (d *driver) kill() {
	_ = unix.Kill(-d.pid, unix.SIGKILL)
	_ = unix.Kill(d.pid, unix.SIGKILL)
	d.cmdW.Close()
}

// waitExit waits a little for a killed driver to be reaped. It does not
// wait forever: at shutdown the agent's reaper may already have stopped.
func (d *driver) waitExit() {
	select {
	case <-d.exited:
	case <-time.After(3 * time.Second):
		slog.Warn("code interpreter: killed interpreter not reaped", "pid", d.pid)
	}
}

func (d *driver) alive() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

func (d *driver) setSink(s *sink) {
	d.mu.Lock()
	d.sink = s
	d.mu.Unlock()
}

// deliver hands output to the running cell; output between cells (a
// background thread printing) has no reader and is dropped.
func (d *driver) deliver(c chunk) {
	d.mu.Lock()
	s := d.sink
	if c.kind == kindStderr && !c.mark {
		d.stderrTail = append(d.stderrTail, c.text...)
		if n := len(d.stderrTail); n > stderrTailMax {
			d.stderrTail = append([]byte(nil), d.stderrTail[n-stderrTailMax:]...)
		}
	}
	d.mu.Unlock()
	if s == nil {
		return
	}
	select {
	case s.ch <- c:
	case <-s.done:
	}
}

// readOutput forwards fd 1 or 2 of the driver, split at the end-of-cell
// marker and never in the middle of a UTF-8 sequence.
func (d *driver) readOutput(f *os.File, kind string, mark []byte) {
	defer f.Close()
	buf := make([]byte, 32<<10)
	var pending []byte
	for {
		n, err := f.Read(buf)
		pending = append(pending, buf[:n]...)
		for {
			i := bytes.Index(pending, mark)
			if i < 0 {
				break
			}
			if i > 0 {
				d.deliver(chunk{kind: kind, text: string(pending[:i])})
			}
			d.deliver(chunk{kind: kind, mark: true})
			pending = pending[i+len(mark):]
		}
		keep := 0
		if err == nil {
			keep = max(partialPrefix(pending, mark), incompleteUTF8(pending))
		}
		if out := pending[:len(pending)-keep]; len(out) > 0 {
			d.deliver(chunk{kind: kind, text: string(out)})
		}
		pending = append([]byte(nil), pending[len(pending)-keep:]...)
		if err != nil {
			return
		}
	}
}

// partialPrefix is the length of the longest suffix of b that is a proper
// prefix of mark (a marker split across reads).
func partialPrefix(b, mark []byte) int {
	for n := min(len(mark)-1, len(b)); n > 0; n-- {
		if bytes.HasSuffix(b, mark[:n]) {
			return n
		}
	}
	return 0
}

// incompleteUTF8 is the length of a truncated UTF-8 sequence at the end of b.
func incompleteUTF8(b []byte) int {
	for n := 1; n <= 3 && n <= len(b); n++ {
		c := b[len(b)-n]
		if c < 0x80 {
			return 0
		}
		if utf8.RuneStart(c) {
			if !utf8.FullRune(b[len(b)-n:]) {
				return n
			}
			return 0
		}
	}
	return 0
}

func (d *driver) readEvents(f *os.File) {
	defer f.Close()
	defer close(d.events)
	r := bufio.NewReaderSize(f, 64<<10)
	for {
		line, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var ev event
			if jerr := json.Unmarshal(line, &ev); jerr != nil {
				slog.Warn("code interpreter: bad driver event", "pid", d.pid, "err", jerr)
			} else {
				d.events <- ev
			}
		}
		if err != nil {
			return
		}
	}
}

// cell is one execution request for a driver.
type cell struct {
	Type    string            `json:"type"`
	Code    string            `json:"code"`
	EnvVars map[string]string `json:"env_vars,omitempty"`
	// EnvBase are variables set for good before the cell: what changed
	// in the sandbox's environment since the driver started.
	EnvBase map[string]string `json:"env_base,omitempty"`
}

// envUpdate is what env has that the driver's start environment has not.
func (d *driver) envUpdate(env []string) map[string]string {
	had := map[string]bool{}
	for _, kv := range d.env {
		had[kv] = true
	}
	var up map[string]string
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || had[kv] {
			continue
		}
		if up == nil {
			up = map[string]string{}
		}
		up[k] = v
	}
	return up
}

// send hands one cell to the driver: a JSON line, or for the bash driver
// three NUL-terminated scripts (set the env vars, the cell, restore them).
func (d *driver) send(c cell) error {
	var b []byte
	if d.lang.nulFramed {
		if strings.ContainsRune(c.Code, 0) {
			return errNULInCell
		}
		set, restore := shellEnvScripts(c.EnvVars)
		b = []byte(set + "\x00" + c.Code + "\x00" + restore + "\x00")
	} else {
		var err error
		if b, err = json.Marshal(c); err != nil {
			return err
		}
		b = append(b, '\n')
	}
	_, err := d.cmdW.Write(b)
	return err
}

// errCwdDenied is a context's cwd the sandbox user cannot enter.
var errCwdDenied = errors.New("the sandbox user may not enter this directory")

var errNULInCell = errors.New("a bash cell cannot contain NUL bytes")

var shellNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// shellEnvScripts are the bash lines that export env (names that are not
// shell identifiers cannot be exported by bash and are skipped) and put
// back what they replaced, as E2B sets a cell's env vars and resets them
// after it.
func shellEnvScripts(env map[string]string) (set, restore string) {
	var sb, rb strings.Builder
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !shellNameRE.MatchString(k) || strings.ContainsRune(env[k], 0) {
			continue
		}
		old := "__cella_old_" + k
		fmt.Fprintf(&sb, "if [ \"${%s+x}\" ]; then %s=\"$%s\"; else unset %s; fi; export %s=%s\n", k, old, k, old, k, shellQuote(env[k]))
		fmt.Fprintf(&rb, "if [ \"${%s+x}\" ]; then export %s=\"$%s\"; else unset %s; fi; unset %s\n", old, k, old, k, old)
	}
	return sb.String(), rb.String()
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// interrupt is Jupyter's interrupt button: SIGINT to the interpreter (to
// its process group for bash, which leaves the signal to its foreground
// command).
func (d *driver) interrupt() {
	if d.lang.interruptGroup {
		_ = unix.Kill(-d.pid, unix.SIGINT)
	}
	_ = unix.Kill(d.pid, unix.SIGINT)
}

func describeStatus(ws unix.WaitStatus) string {
	switch {
	case ws.Exited():
		return fmt.Sprintf("exit status %d", ws.ExitStatus())
	case ws.Signaled():
		return "signal: " + unix.SignalName(ws.Signal())
	default:
		return fmt.Sprintf("wait status %#x", uint32(ws))
	}
}

// findExe looks the interpreter up on the interpreter's own PATH (not the
// agent's).
func findExe(names []string, env []string) (string, error) {
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, name := range names {
		for _, dir := range filepath.SplitList(path) {
			if dir == "" {
				continue
			}
			p := filepath.Join(dir, name)
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("none of %s found on PATH %q", strings.Join(names, ", "), path)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
