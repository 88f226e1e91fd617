package build

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/envd/process"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/template"
)

// box is a build sandbox on the image of the steps so far.
type box struct {
	r  *run
	sb *sandbox.Sandbox
}

// boot creates a build sandbox on img: the build's egress, the spec's
// resources, owned by the builder.
func (r *run) boot(ctx context.Context, img *template.Template) (*box, error) {
	name := r.spec.Name
	if len(name) > 63 {
		name = "build"
	}
	opts := sandbox.Options{
		TemplateID: name, Image: img.Image, Services: r.parentServices(),
		CPUs: float64(r.spec.CPUs), MemoryMB: int64(r.spec.MemoryMB), DiskMB: int64(r.spec.DiskMB),
		Egress:   r.e.egressFor(r.p),
		Metadata: map[string]string{"cella.build": r.spec.Name, "cella.build.team": r.p.Team},
	}
	if dl, ok := ctx.Deadline(); ok {
		opts.Timeout = time.Until(dl) + time.Minute
	}
	sb, err := r.e.cfg.Sandboxes.Create(ctx, r.e.builder(), opts)
	if err != nil {
		return nil, fmt.Errorf("start build sandbox: %w", err)
	}
	return &box{r: r, sb: sb}, nil
}

// parentServices are the services of the template the build is on, which
// its steps run too (the docker template's engine); none on an image.
func (r *run) parentServices() []string {
	if r.parent == nil {
		return nil
	}
	return r.parent.Services
}

func (b *box) kill() {
	if err := b.r.e.cfg.Sandboxes.Kill(context.Background(), b.r.e.builder(), b.sb.ID); err != nil {
		b.r.e.cfg.Log.Warn("kill build sandbox", "id", b.sb.ID, "err", err)
	}
}

// result is how a command ended.
type result struct {
	code   int
	errMsg string // the agent's reason when a limit ended it
	output string // the last lines of its output
}

// exec runs cmd with `bash -l -c` as user in cwd with env, sending each
// output line to out (nil: none), and returns how it ended.
func (b *box) exec(ctx context.Context, user, cwd string, env map[string]string, cmd string, out func(stream, line string)) (result, error) {
	return b.execArgs(ctx, user, cwd, env, out, "-l", "-c", cmd)
}

func (b *box) execArgs(ctx context.Context, user, cwd string, env map[string]string, out func(stream, line string), args ...string) (result, error) {
	req := &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: args, Envs: env}}
	if cwd != "" {
		req.Process.Cwd = &cwd
	}
	stream, err := b.sb.Agent().Process(user).Start(ctx, connect.NewRequest(req))
	if err != nil {
		return result{}, fmt.Errorf("start command: %w", err)
	}
	defer stream.Close()
	tail := &tailBuf{}
	lines := map[string]*lineSplitter{}
	feed := func(name string, p []byte) {
		tail.Write(p)
		if out == nil {
			return
		}
		ls := lines[name]
		if ls == nil {
			ls = &lineSplitter{emit: func(l string) { out(name, l) }}
			lines[name] = ls
		}
		ls.write(p)
	}
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		switch {
		case ev.GetData() != nil:
			feed("stdout", ev.GetData().GetStdout())
			feed("stderr", ev.GetData().GetStderr())
		case ev.GetEnd() != nil:
			for _, ls := range lines {
				ls.flush()
			}
			end := ev.GetEnd()
			res := result{code: int(end.GetExitCode()), output: tail.String()}
			if !end.GetExited() || end.GetError() != "" {
				res.errMsg = end.GetError()
				if res.code == 0 {
					res.code = -1
				}
			}
			return res, nil
		}
	}
	if err := stream.Err(); err != nil {
		return result{}, fmt.Errorf("command stream: %w", err)
	}
	return result{}, errors.New("command stream ended without an end event")
}

// cmdErr is E2B's message for a failed command.
func cmdErr(cmd string, res result) error {
	if res.errMsg != "" && res.code < 0 {
		return fmt.Errorf("failed to run command '%s': %s", cmd, res.errMsg)
	}
	return fmt.Errorf("failed to run command '%s': exit status %d", cmd, res.code)
}

// root runs a script of the engine's own as root (args as $1...).
func (b *box) root(ctx context.Context, script string, args ...string) (result, error) {
	return b.execArgs(ctx, "root", "/", nil, nil, append([]string{"-c", script, "cella-build"}, args...)...)
}

// step runs one uncached step and returns its cache entry: the layer it
// made and the context after it.
func (r *run) step(ctx context.Context, step, prefix, typ string, st Step) (template.CacheEntry, error) {
	next := r.cur
	next.env = append([]string(nil), r.cur.env...)
	if typ == StepEnv {
		// E2B evaluates each value with printf "%s" in the build: only
		// variable expansion, no command substitution, so it is done here.
		for i := 0; i+1 < len(st.Args); i += 2 {
			next.setEnv(st.Args[i], expand(st.Args[i+1], next.envMap()))
		}
		return next.entry(""), nil
	}
	// What needs no sandbox: root always exists, / always is.
	if typ == StepUser && st.Args[0] == "root" && (len(st.Args) < 2 || st.Args[1] != "true") {
		next.user, next.uid, next.gid = "root", 0, 0
		return next.entry(""), nil
	}
	if typ == StepWorkdir && path.Clean(st.Args[0]) == "/" {
		next.workdir = "/"
		return next.entry(""), nil
	}
	holder, err := r.newHolder()
	if err != nil {
		return template.CacheEntry{}, err
	}
	img, err := r.e.cfg.Templates.Derive(holder, r.parent, r.layers, r.cur.defaults("", ""))
	if err != nil {
		return template.CacheEntry{}, err
	}
	b, err := r.boot(ctx, img)
	if err != nil {
		return template.CacheEntry{}, err
	}
	defer b.kill()
	out := func(stream, line string) { r.emit(LevelInfo, step, "%s [%s]: %s", prefix, stream, line) }
	switch typ {
	case StepRun:
		user := r.cur.user
		if len(st.Args) > 1 && st.Args[1] != "" {
			user = st.Args[1]
		}
		res, err := b.exec(ctx, user, r.cur.workdir, r.cur.envMap(), st.Args[0], out)
		if err != nil {
			return template.CacheEntry{}, err
		}
		if res.code != 0 {
			return template.CacheEntry{}, &StepError{Step: step, Message: cmdErr(st.Args[0], res).Error()}
		}
	case StepWorkdir:
		dir := st.Args[0]
		if !path.IsAbs(dir) {
			base := r.cur.workdir
			if base == "" {
				base = "/"
			}
			dir = path.Join(base, dir)
		}
		dir = path.Clean(dir)
		res, err := b.root(ctx, workdirScript, dir, r.cur.user)
		if err != nil {
			return template.CacheEntry{}, err
		}
		if res.code != 0 {
			return template.CacheEntry{}, fmt.Errorf("failed to create workdir '%s': %s", dir, strings.TrimSpace(res.output))
		}
		next.workdir = dir
	case StepUser:
		name := st.Args[0]
		sudo := len(st.Args) > 1 && st.Args[1] == "true"
		res, err := b.root(ctx, userScript, name, strconv.FormatBool(sudo))
		if err != nil {
			return template.CacheEntry{}, err
		}
		f := strings.Fields(lastLine(res.output))
		if res.code != 0 || len(f) < 2 {
			return template.CacheEntry{}, fmt.Errorf("failed to set user '%s': %s", name, strings.TrimSpace(res.output))
		}
		next.user = name
		next.uid, _ = strconv.Atoi(f[0])
		next.gid, _ = strconv.Atoi(f[1])
	case StepCopy:
		if err := r.copyStep(ctx, b, st); err != nil {
			return template.CacheEntry{}, err
		}
	}
	// What the step wrote reaches the layer's disk before the capture.
	if _, err := b.root(ctx, "sync"); err != nil {
		return template.CacheEntry{}, err
	}
	layer, err := r.storeLayer(ctx, b.sb.ID)
	if err != nil {
		return template.CacheEntry{}, err
	}
	return next.entry(layer), nil
}

// workdirScript makes $1 with mkdir -p, gives the first directory it had
// to make (and all below) to user $2, as E2B does.
const workdirScript = `d=$1; first=; p=$d
while [ ! -e "$p" ] && [ "$p" != / ]; do first=$p; p=$(dirname "$p"); done
mkdir -p "$d" || exit 1
[ -d "$d" ] || { echo "$d is not a directory"; exit 1; }
if [ -n "$first" ]; then chown -R "$2:" "$first" 2>/dev/null || chown -R "$2" "$first"; fi
exit 0`

// userScript creates user $1 if missing (useradd, or busybox adduser),
// adds it to sudoers when $2 is true, and prints its uid and gid.
const userScript = `u=$1
if ! id -u "$u" >/dev/null 2>&1; then
  if command -v useradd >/dev/null 2>&1; then useradd --create-home --shell /bin/bash "$u" || exit 1
  else adduser -D "$u" || exit 1; fi
fi
if [ "$2" = true ]; then
  mkdir -p /etc/sudoers.d && echo "$u ALL=(ALL:ALL) NOPASSWD: ALL" > "/etc/sudoers.d/$u" && chmod 0440 "/etc/sudoers.d/$u" || exit 1
fi
echo "$(id -u "$u") $(id -g "$u")"`

// copyScript places the unpacked source $1 at $2 with Docker's COPY
// semantics (§4.3), owned by $3, with mode $4 ("" keeps it), then removes
// the scratch dir $5.
const copyScript = `src=$1 dest=$2 owner=$3 mode=$4 scratch=$5
fail() { rm -rf "$scratch"; echo "$1" >&2; exit 1; }
[ -e "$src" ] || [ -L "$src" ] || fail "no files found at $6 in the uploaded archive"
if [ -L "$src" ] || [ ! -d "$src" ]; then
  case $dest in */) mkdir -p "$dest" || fail "cannot create $dest"; dest=$dest$(basename "$src");; *) mkdir -p "$(dirname "$dest")" || fail "cannot create the parent of $dest";; esac
  [ -d "$dest" ] && [ ! -L "$dest" ] && dest=$dest/$(basename "$src")
  chown -h "$owner" "$src" || fail "chown $owner failed"
  if [ -n "$mode" ] && [ ! -L "$src" ]; then chmod "$mode" "$src" || fail "chmod $mode failed"; fi
  rm -rf "$dest" 2>/dev/null; mv -f "$src" "$dest" || fail "cannot write $dest"
else
  chown -R -h "$owner" "$src" || fail "chown $owner failed"
  if [ -n "$mode" ]; then chmod -R "$mode" "$src" || fail "chmod $mode failed"; fi
  if [ ! -e "$dest" ]; then
    mkdir -p "$dest" && chown "$owner" "$dest" || fail "cannot create $dest"
    if [ -n "$mode" ]; then chmod "$mode" "$dest" || fail "chmod $mode failed"; fi
  fi
  if tar --version 2>/dev/null | grep -q GNU; then
    (cd "$src" && tar -cf - .) | tar -xf - -C "$dest" --keep-directory-symlink --no-overwrite-dir || fail "cannot write into $dest"
  else
    cp -a "$src/." "$dest/" || fail "cannot write into $dest"
  fi
fi
rm -rf "$scratch"`

// copyStep uploads the step's files into a scratch dir of the build
// sandbox (the agent extracts the archive as root inside the sandbox and
// refuses entries that leave the directory) and places them there.
func (r *run) copyStep(ctx context.Context, b *box, st Step) error {
	src, dest, owner, mode := st.Args[0], st.Args[1], st.Args[2], st.Args[3]
	prefix, err := staticPrefix(src)
	if err != nil {
		return err
	}
	if mode != "" {
		if _, err := strconv.ParseUint(mode, 8, 32); err != nil || len(mode) > 5 {
			return fmt.Errorf("invalid COPY mode %q: want an octal mode like 0755", mode)
		}
	}
	switch {
	case owner == "":
		owner = r.cur.user + ":" + r.cur.user
	case !strings.Contains(owner, ":"):
		owner = owner + ":" + owner
	}
	if !ownerRE.MatchString(owner) {
		return fmt.Errorf("invalid COPY owner %q", owner)
	}
	if !path.IsAbs(dest) {
		base := r.cur.workdir
		if base == "" {
			base = "/home/" + r.cur.user
		}
		trail := strings.HasSuffix(dest, "/")
		dest = path.Join(base, dest)
		if trail {
			dest += "/"
		}
	}
	if r.files == nil {
		return errors.New("COPY requires files, and the build has none")
	}
	rc, err := r.files.Open(ctx, st.FilesHash)
	if err != nil {
		return fmt.Errorf("COPY files %s: %w", st.FilesHash, err)
	}
	defer rc.Close()
	scratch := "/tmp/.cella-copy-" + st.FilesHash[:16]
	if err := b.upload(ctx, scratch+"/unpack", rc); err != nil {
		return err
	}
	srcPath := scratch + "/unpack"
	if prefix != "" {
		srcPath += "/" + prefix
	}
	res, err := b.root(ctx, copyScript, srcPath, dest, owner, mode, scratch, src)
	if err != nil {
		return err
	}
	if res.code != 0 {
		return fmt.Errorf("failed to copy '%s' to '%s': %s", src, dest, strings.TrimSpace(res.output))
	}
	return nil
}

var ownerRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?$`)

// staticPrefix is the part of a COPY source before its first glob
// component (E2B: doublestar.SplitPattern), checked to stay inside the
// archive.
func staticPrefix(src string) (string, error) {
	var parts []string
	for _, c := range strings.Split(strings.Trim(src, "/"), "/") {
		if strings.ContainsAny(c, "*?[{") {
			break
		}
		parts = append(parts, c)
	}
	p := path.Clean(strings.Join(parts, "/"))
	if p == "." {
		return "", nil
	}
	if path.IsAbs(src) || p == ".." || strings.HasPrefix(p, "../") {
		return "", fmt.Errorf("COPY source %q must be relative and stay inside the build context", src)
	}
	return p, nil
}

// upload sends a tar (gzipped or not) to the agent, which extracts it as
// root into dir inside the sandbox.
func (b *box) upload(ctx context.Context, dir string, r io.Reader) error {
	br := bufio.NewReader(r)
	magic, _ := br.Peek(2)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.sb.Agent().URL(agentapi.TarPath, url.Values{"path": {dir}, "username": {"root"}}), br)
	if err != nil {
		return err
	}
	if bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := b.sb.Agent().HTTP("root").Do(req)
	if err != nil {
		return fmt.Errorf("COPY: upload files: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		var e struct{ Message string }
		if json.Unmarshal(body, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(body))
		}
		return fmt.Errorf("COPY: the files archive was refused: %s", e.Message)
	}
	return nil
}

// expand is the variable expansion of E2B's printf "%s" "<value>": $VAR,
// ${VAR} and ${VAR:-default} from env; unknown variables are empty.
func expand(v string, env map[string]string) string {
	return os.Expand(v, func(k string) string {
		if name, def, ok := strings.Cut(k, ":-"); ok {
			if val := env[name]; val != "" {
				return val
			}
			return def
		}
		return env[k]
	})
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// lineSplitter turns a stream into lines.
type lineSplitter struct {
	buf  []byte
	emit func(string)
}

const maxLine = 16 << 10

func (l *lineSplitter) write(p []byte) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			if len(l.buf) > maxLine {
				l.emit(string(l.buf))
				l.buf = l.buf[:0]
			}
			return
		}
		l.emit(strings.TrimRight(string(l.buf[:i]), "\r"))
		l.buf = l.buf[i+1:]
	}
}

func (l *lineSplitter) flush() {
	if len(l.buf) > 0 {
		l.emit(string(l.buf))
		l.buf = nil
	}
}

// tailBuf keeps the last 4 KiB written to it: a command's output for an
// error message.
type tailBuf struct{ b []byte }

func (t *tailBuf) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tailBuf) String() string { return string(t.b) }
