// Package dockerfile translates a Dockerfile into template builds
// (internal/build's Spec: E2B's step model), the way E2B's SDK
// fromDockerfile does (../shared/e2b-template-api.md §3.2), parsed with
// buildkit's own parser (frontend/dockerfile/parser; only the parser and
// its word expansion, not buildkit's solver): FROM (an image, a template,
// or an earlier stage), RUN (shell and exec form), COPY/ADD of local files
// and COPY --from an earlier stage, ENV, ARG (defaults and build args),
// WORKDIR, USER, CMD/ENTRYPOINT as the start command. EXPOSE, LABEL,
// VOLUME, STOPSIGNAL, SHELL-less metadata are accepted and ignored with a
// log line; anything else is refused naming its line.
//
// Each stage the last one needs is a build of its own: earlier stages
// become templates (NAME-stage-N) that later stages start from or copy
// out of; Run drives them through a Runner (the daemon's engine, or the
// E2B build API).
package dockerfile

import (
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/cella-sandbox/cella/internal/build"
)

// Source is where a COPY step's files come from: the build context
// (Paths, relative to it) or an earlier stage's template (Stage >= 0,
// Paths absolute in it).
type Source struct {
	Stage int
	Paths []string
}

// Stage is one build of the plan.
type Stage struct {
	// Name is the template the stage makes: the plan's name for the last
	// stage, NAME-stage-N for the others.
	Name string
	// Alias is the stage's `AS` name, if any.
	Alias string
	// Spec is the build; a FROM of an earlier stage has Base.Template =
	// that stage's Name. COPY steps have an empty FilesHash, which Run
	// fills from Sources (index = step index).
	Spec    build.Spec
	Sources map[int]Source
}

// Plan is a Dockerfile's builds, in the order they must run; the last is
// the template asked for.
type Plan struct {
	Stages []Stage
}

// Options tune Parse.
type Options struct {
	// Name is the template the Dockerfile makes.
	Name string
	// BuildArgs override ARG defaults (--build-arg K=V).
	BuildArgs map[string]string
	// Log receives notes on what is accepted and ignored (EXPOSE, LABEL).
	Log func(string)
}

// ignored are the instructions that change nothing a template keeps.
var ignored = map[string]bool{"expose": true, "label": true, "volume": true, "stopsignal": true, "maintainer": true}

// envs is an EnvGetter over an ordered list.
type envs struct{ kv []string }

func (e *envs) Get(k string) (string, bool) {
	for i := len(e.kv) - 1; i >= 0; i-- {
		if kk, v, _ := strings.Cut(e.kv[i], "="); kk == k {
			return v, true
		}
	}
	return "", false
}

func (e *envs) Keys() []string {
	var out []string
	for _, kv := range e.kv {
		k, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

func (e *envs) set(k, v string) { e.kv = append(e.kv, k+"="+v) }

// Parse reads a Dockerfile into a plan.
func Parse(r io.Reader, o Options) (*Plan, error) {
	res, err := parser.Parse(r)
	if err != nil {
		return nil, fmt.Errorf("Dockerfile: %w", err)
	}
	logf := o.Log
	if logf == nil {
		logf = func(string) {}
	}
	lex := shell.NewLex(res.EscapeToken)
	var (
		stages              []Stage
		cur                 *Stage
		vars                *envs // ARGs and ENVs in scope for expansion
		global              = &envs{}
		setUser, setWorkdir bool
		entrypoint, cmd     string
	)
	where := func(n *parser.Node) string { return fmt.Sprintf("Dockerfile:%d", n.StartLine) }
	word := func(n *parser.Node, s string) (string, error) {
		out, _, err := lex.ProcessWord(s, vars)
		if err != nil {
			return "", fmt.Errorf("%s: %w", where(n), err)
		}
		return out, nil
	}
	add := func(st build.Step) int {
		cur.Spec.Steps = append(cur.Spec.Steps, st)
		return len(cur.Spec.Steps) - 1
	}
	finish := func() {
		if cur == nil {
			return
		}
		// E2B's fromDockerfile: a template's default user and workdir are
		// E2B's unless the Dockerfile set them.
		if !setUser {
			add(build.Step{Type: build.StepUser, Args: []string{"user"}})
		}
		if !setWorkdir {
			add(build.Step{Type: build.StepWorkdir, Args: []string{"/home/user"}})
		}
		if start := strings.TrimSpace(entrypoint + " " + cmd); start != "" {
			cur.Spec.StartCmd = start
		}
		stages = append(stages, *cur)
	}
	for _, n := range res.AST.Children {
		inst := strings.ToLower(n.Value)
		args := nodeArgs(n)
		if cur == nil && inst != "from" && inst != "arg" {
			return nil, fmt.Errorf("%s: %s before the first FROM", where(n), strings.ToUpper(inst))
		}
		if ignored[inst] {
			logf(fmt.Sprintf("%s: %s is ignored (it changes nothing a template keeps)", where(n), strings.ToUpper(inst)))
			continue
		}
		if err := checkFlags(n, inst); err != nil {
			return nil, err
		}
		switch inst {
		case "from":
			if len(args) != 1 && !(len(args) == 3 && strings.EqualFold(args[1], "as")) {
				return nil, fmt.Errorf("%s: FROM takes IMAGE [AS NAME]", where(n))
			}
			finish()
			vars = &envs{kv: slices.Clone(global.kv)}
			ref, err := word(n, args[0])
			if err != nil {
				return nil, err
			}
			// Named by its index until prune gives it its template name.
			st := Stage{Name: fmt.Sprintf("\x00stage-%d", len(stages)), Sources: map[int]Source{}}
			if len(args) == 3 {
				st.Alias = strings.ToLower(args[2])
			}
			if i := stageIndex(stages, ref); i >= 0 {
				st.Spec.Base.Template = stages[i].Name
			} else if t, ok := strings.CutPrefix(ref, "template:"); ok {
				st.Spec.Base.Template = t // cella: FROM template:NAME starts from a template
			} else {
				st.Spec.Base.Image = ref
			}
			cur, setUser, setWorkdir, entrypoint, cmd = &st, false, false, "", ""
			// As E2B: a Dockerfile runs as root in / unless it says.
			add(build.Step{Type: build.StepUser, Args: []string{"root"}})
			add(build.Step{Type: build.StepWorkdir, Args: []string{"/"}})
		case "arg":
			for _, a := range args {
				k, v, hasDef := strings.Cut(a, "=")
				if ov, ok := o.BuildArgs[k]; ok {
					v, hasDef = ov, true
				} else if hasDef {
					var err error
					if v, err = word(n, v); err != nil {
						return nil, err
					}
				} else if gv, ok := global.Get(k); ok && cur != nil {
					v = gv // an ARG redeclared in a stage takes the global default
				}
				if cur == nil {
					global.set(k, v)
					continue
				}
				_ = hasDef
				vars.set(k, v)
				add(build.Step{Type: build.StepEnv, Args: []string{k, v}})
			}
		case "env":
			// The parser gives triples: key, value, separator.
			if len(args) < 3 || len(args)%3 != 0 {
				return nil, fmt.Errorf("%s: ENV takes KEY=VALUE pairs", where(n))
			}
			var kv []string
			for i := 0; i < len(args); i += 3 {
				v, err := word(n, args[i+1])
				if err != nil {
					return nil, err
				}
				vars.set(args[i], v)
				kv = append(kv, args[i], v)
			}
			add(build.Step{Type: build.StepEnv, Args: kv})
		case "run":
			c := strings.Join(args, " ")
			if n.Attributes["json"] {
				c = shellJoin(args)
			}
			if len(n.Heredocs) > 0 {
				return nil, fmt.Errorf("%s: RUN with a heredoc is not supported", where(n))
			}
			add(build.Step{Type: build.StepRun, Args: []string{c}})
		case "workdir":
			if len(args) != 1 {
				return nil, fmt.Errorf("%s: WORKDIR takes one path", where(n))
			}
			d, err := word(n, args[0])
			if err != nil {
				return nil, err
			}
			setWorkdir = true
			add(build.Step{Type: build.StepWorkdir, Args: []string{d}})
		case "user":
			if len(args) != 1 {
				return nil, fmt.Errorf("%s: USER takes one name", where(n))
			}
			u, err := word(n, args[0])
			if err != nil {
				return nil, err
			}
			if name, _, _ := strings.Cut(u, ":"); name != u {
				u = name // a group is the user's own in a template
			}
			setUser = true
			add(build.Step{Type: build.StepUser, Args: []string{u}})
		case "copy", "add":
			if err := addCopy(n, inst, args, stages, cur, word, add); err != nil {
				return nil, err
			}
		case "cmd", "entrypoint":
			c := strings.Join(args, " ")
			if n.Attributes["json"] {
				c = shellJoin(args)
			}
			if inst == "cmd" {
				cmd = c
			} else {
				entrypoint, cmd = c, "" // Docker: ENTRYPOINT resets CMD
			}
		default:
			return nil, fmt.Errorf("%s: %s is not supported", where(n), strings.ToUpper(inst))
		}
	}
	if cur == nil {
		return nil, errors.New("Dockerfile: no FROM")
	}
	finish()
	return prune(stages, o.Name)
}

// addCopy translates COPY/ADD: one step per source (as E2B's SDK).
func addCopy(n *parser.Node, inst string, args []string, stages []Stage, cur *Stage, word func(*parser.Node, string) (string, error), add func(build.Step) int) error {
	where := fmt.Sprintf("Dockerfile:%d", n.StartLine)
	if len(n.Heredocs) > 0 {
		return fmt.Errorf("%s: %s with a heredoc is not supported", where, strings.ToUpper(inst))
	}
	if len(args) < 2 {
		return fmt.Errorf("%s: %s takes SRC... DEST", where, strings.ToUpper(inst))
	}
	var owner, mode, from string
	for _, f := range n.Flags {
		k, v, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		switch k {
		case "chown":
			owner = v
		case "chmod":
			mode = v
		case "from":
			from = strings.ToLower(v)
		}
	}
	if mode != "" {
		if _, err := strconv.ParseUint(mode, 8, 32); err != nil {
			return fmt.Errorf("%s: --chmod=%s: want an octal mode", where, mode)
		}
		mode = fmt.Sprintf("%04s", mode)
	}
	dest, err := word(n, args[len(args)-1])
	if err != nil {
		return err
	}
	if len(args) > 2 && !strings.HasSuffix(dest, "/") {
		dest += "/" // several sources go into a directory
	}
	stage := -1
	if from != "" {
		if stage = stageIndex(stages, from); stage < 0 {
			return fmt.Errorf("%s: COPY --from=%s: only an earlier stage can be copied from", where, from)
		}
	}
	for _, a := range args[:len(args)-1] {
		src, err := word(n, a)
		if err != nil {
			return err
		}
		if inst == "add" && (strings.Contains(src, "://") || strings.HasPrefix(src, "git@")) {
			return fmt.Errorf("%s: ADD of a URL is not supported (use RUN curl)", where)
		}
		if stage >= 0 {
			if !path.IsAbs(src) {
				src = "/" + src
			}
			i := add(build.Step{Type: build.StepCopy, Args: []string{path.Base(path.Clean(src)), dest, owner, mode}})
			cur.Sources[i] = Source{Stage: stage, Paths: []string{path.Clean(src)}}
			continue
		}
		clean := path.Clean(strings.TrimPrefix(src, "/"))
		if clean == ".." || strings.HasPrefix(clean, "../") {
			return fmt.Errorf("%s: %s source %q is outside the build context", where, strings.ToUpper(inst), src)
		}
		i := add(build.Step{Type: build.StepCopy, Args: []string{clean, dest, owner, mode}})
		cur.Sources[i] = Source{Stage: -1, Paths: []string{clean}}
	}
	return nil
}

func checkFlags(n *parser.Node, inst string) error {
	allowed := map[string][]string{"copy": {"from", "chown", "chmod"}, "add": {"chown", "chmod"}, "from": {"platform"}}
	for _, f := range n.Flags {
		k, _, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		if !slices.Contains(allowed[inst], k) {
			return fmt.Errorf("Dockerfile:%d: %s --%s is not supported", n.StartLine, strings.ToUpper(inst), k)
		}
	}
	return nil
}

// stageIndex finds an earlier stage by its AS name or its number.
func stageIndex(stages []Stage, ref string) int {
	for i, s := range stages {
		if s.Alias != "" && s.Alias == strings.ToLower(ref) {
			return i
		}
	}
	if i, err := strconv.Atoi(ref); err == nil && i >= 0 && i < len(stages) {
		return i
	}
	return -1
}

// prune keeps the stages the last one needs, names them, and renumbers
// their references.
func prune(stages []Stage, name string) (*Plan, error) {
	need := map[int]bool{len(stages) - 1: true}
	for i := len(stages) - 1; i >= 0; i-- {
		if !need[i] {
			continue
		}
		for _, src := range stages[i].Sources {
			if src.Stage >= 0 {
				need[src.Stage] = true
			}
		}
		if b := stages[i].Spec.Base.Template; b != "" {
			for j := range i {
				if stages[j].Name == b {
					need[j] = true
				}
			}
		}
	}
	// Names first (bases refer to them by name), so fill them now.
	newIdx := map[int]int{}
	var out []Stage
	for i := range stages {
		if !need[i] {
			continue
		}
		newIdx[i] = len(out)
		out = append(out, stages[i])
	}
	for j := range out {
		old := out[j]
		nm := fmt.Sprintf("%s-stage-%d", name, j)
		if j == len(out)-1 {
			nm = name
		}
		for k := range out {
			if out[k].Spec.Base.Template == old.Name && old.Name != "" {
				out[k].Spec.Base.Template = nm
			}
		}
		out[j].Name = nm
		out[j].Spec.Name = nm
		srcs := map[int]Source{}
		for i, s := range old.Sources {
			if s.Stage >= 0 {
				s.Stage = newIdx[s.Stage]
			}
			srcs[i] = s
		}
		out[j].Sources = srcs
	}
	return &Plan{Stages: out}, nil
}

// nodeArgs are an instruction's arguments.
func nodeArgs(n *parser.Node) []string {
	var out []string
	for a := n.Next; a != nil; a = a.Next {
		out = append(out, a.Value)
	}
	return out
}

// shellJoin quotes an exec-form argument list for bash -c.
func shellJoin(args []string) string {
	var out []string
	for _, a := range args {
		if a != "" && !strings.ContainsAny(a, " \t\n'\"\\$`|&;<>()*?[]{}!#~") {
			out = append(out, a)
			continue
		}
		out = append(out, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
	}
	return strings.Join(out, " ")
}
