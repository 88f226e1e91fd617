// Package builds is E2B's template build API without its HTTP: templates
// made over the API with their owning team (private to it until
// published), aliases and tags naming their builds, each build's status,
// reason and log, the team-scoped files cache with its self-authorizing
// upload URLs (files.go), and the running of builds through a
// build.Builder with the caller's principal. State lives in SQLite
// (internal/store), so it outlives the daemon; a build in progress when the
// daemon died is failed when the next one starts.
//
// A build installs a template-store name of its own (storeName); aliases
// and tags are this package's and never reach the template store, so two
// teams' names cannot collide there and a private template cannot be
// reached by its store name (Resolve checks it).
package builds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// Build statuses, E2B's.
const (
	StatusWaiting  = "waiting"
	StatusBuilding = "building"
	StatusReady    = "ready"
	StatusError    = "error"
)

// Reasons the service itself gives.
const (
	ReasonRestarted  = "the daemon restarted during the build"
	ReasonSuperseded = "The build was canceled because it was superseded by a newer one."
)

// Config configures a Service.
type Config struct {
	Store     *store.Store
	Templates *template.Store
	// Builder runs builds; nil: triggers answer 501.
	Builder build.Builder
	// Starter captures a pulled cluster build's start command running
	// (shared.go); nil: a pulled build with one cannot be used here.
	Starter build.Starter
	// Dir holds the files cache and the upload key.
	Dir string
	// MaxLogBytes bounds each build's log (0: DefaultMaxLogBytes).
	MaxLogBytes int64
	// Shared, on a cluster node, is the cluster's record of API
	// templates (shared.go); nil: standalone.
	Shared Shared
	Log    *slog.Logger
}

// Service is the build API's core.
type Service struct {
	cfg Config
	key []byte
	log *slog.Logger

	ctx    context.Context // canceled by Close: running builds stop
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// imports are the cluster builds being pulled and prepared here, by
	// store name (shared.go).
	imports singleflight.Group

	mu sync.Mutex
	// running are the logs of builds in progress, by build ID.
	running map[string]*logSink
	// startFailed are the pulled builds whose start command failed here
	// lately, by store name (shared.go): creates fail at once until the
	// entry's retry time rather than each booting a capture again.
	startFailed map[string]failedStart
}

// New opens the service: the upload key, and the builds a previous daemon
// left in progress failed with ReasonRestarted.
func New(cfg Config) (*Service, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.MaxLogBytes <= 0 {
		cfg.MaxLogBytes = DefaultMaxLogBytes
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("builds dir: %w", err)
	}
	key, err := loadKey(cfg.Dir)
	if err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, key: key, log: cfg.Log, running: map[string]*logSink{}, startFailed: map[string]failedStart{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	ctx := context.Background()
	failed, err := cfg.Store.FailBuilds(ctx, "", []string{StatusBuilding}, "", ReasonRestarted)
	if err != nil {
		return nil, fmt.Errorf("fail interrupted builds: %w", err)
	}
	for _, id := range failed {
		n, err := cfg.Store.CountBuildLogs(ctx, id)
		if err != nil {
			return nil, err
		}
		if err := cfg.Store.AppendBuildLogs(ctx, id, []store.BuildLog{{Seq: n, Time: time.Now(), Level: build.LevelError,
			Message: "Build failed: " + ReasonRestarted}}); err != nil {
			return nil, err
		}
		s.log.Warn("template build interrupted by a daemon restart", "build", id)
	}
	return s, nil
}

// Close stops running builds and waits for them. Their records stay
// "building": the next daemon fails them with ReasonRestarted.
func (s *Service) Close() {
	s.cancel()
	s.wg.Wait()
}

// Caller is who asks: the principal and its team's name (E2B's namespace).
type Caller struct {
	P        tenant.Principal
	TeamName string
}

// owns: the caller may change the template (its team's, or the admin).
func (c Caller) owns(t store.APITemplate) bool { return c.P.Can(tenant.Owner{Team: t.TeamID}) }

// sees: the caller may use the template (owns it, or it is public).
func (c Caller) sees(t store.APITemplate) bool { return t.Public || c.owns(t) }

func templateNotFound(ref string) error { return errdefs.NotFound("template %q not found", ref) }

// findTemplate returns the API template ref names (its ID, alias or
// namespace/alias; any tag is ignored) if the caller may see it (owned:
// may change it). Unknown and foreign answer the same.
func (s *Service) findTemplate(ctx context.Context, c Caller, ref string, owned bool) (store.APITemplate, Name, error) {
	t, err := s.cfg.Store.GetAPITemplate(ctx, ref)
	n := Name{Alias: ref}
	if errors.Is(err, store.ErrNotFound) {
		if n, err = ParseName(ref); err != nil {
			return t, n, templateNotFound(ref)
		}
		t, err = s.cfg.Store.GetAPITemplateByAlias(ctx, n.Alias)
	}
	if errors.Is(err, store.ErrNotFound) {
		return t, n, templateNotFound(ref)
	}
	if err != nil {
		return t, n, err
	}
	if !c.sees(t) || owned && !c.owns(t) {
		return t, n, templateNotFound(ref)
	}
	return t, n, nil
}

func (s *Service) ownedTemplate(ctx context.Context, c Caller, ref string) (store.APITemplate, error) {
	t, _, err := s.findTemplate(ctx, c, ref, true)
	return t, err
}

// checkNamespace refuses a namespace other than the caller's team.
func checkNamespace(c Caller, n Name, raw string) error {
	if n.Namespace != "" && n.Namespace != strings.ToLower(c.TeamName) {
		return errdefs.InvalidArgument("Invalid template name %q: namespace %q is not your team's (%q)", raw, n.Namespace, c.TeamName)
	}
	return nil
}

// names is E2B's "<team>/<alias>" of a template.
func (s *Service) names(ctx context.Context, t store.APITemplate) []string {
	team := t.TeamID
	if tm, err := s.cfg.Store.GetTeam(ctx, t.TeamID); err == nil {
		team = tm.Name
	}
	return []string{team + "/" + t.Alias}
}

// Request is POST /v3/templates.
type Request struct {
	Name     string
	Tags     []string
	CPUCount *int
	MemoryMB *int
}

// Requested is E2B's TemplateRequestResponseV3.
type Requested struct {
	TemplateID, BuildID string
	Names, Aliases      []string
	Tags                []string
	Public              bool
}

// E2B's defaults and bounds of a build's sandbox (§8.2, §8.8).
const (
	DefaultCPUCount = 2
	MaxCPUCount     = 32
	DefaultMemoryMB = 1024
	MinMemoryMB     = 128
)

// RequestBuild makes the template (or finds the caller's of that alias:
// a rebuild) and a waiting build of it.
func (s *Service) RequestBuild(ctx context.Context, c Caller, req Request) (Requested, error) {
	n, err := ParseName(req.Name)
	if err != nil {
		return Requested{}, err
	}
	if err := checkNamespace(c, n, req.Name); err != nil {
		return Requested{}, err
	}
	cpu, mem := DefaultCPUCount, DefaultMemoryMB
	if req.CPUCount != nil {
		cpu = *req.CPUCount
		if cpu < 1 || cpu > MaxCPUCount || cpu > 1 && cpu%2 != 0 {
			return Requested{}, errdefs.InvalidArgument("cpuCount must be 1 or an even number up to %d (got %d)", MaxCPUCount, cpu)
		}
	}
	if req.MemoryMB != nil {
		mem = *req.MemoryMB
		if mem < MinMemoryMB || mem%2 != 0 {
			return Requested{}, errdefs.InvalidArgument("memoryMB must be an even number of at least %d (got %d)", MinMemoryMB, mem)
		}
	}
	var tags []string
	if n.Tag != "" {
		tags = append(tags, n.Tag)
	}
	more, err := validTags(req.Tags)
	if err != nil {
		return Requested{}, err
	}
	for _, t := range more {
		if !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	if len(tags) == 0 {
		tags = []string{DefaultTag}
	}
	t, err := s.templateFor(ctx, c, n.Alias)
	if err != nil {
		return Requested{}, err
	}
	now := time.Now()
	b := store.Build{ID: newBuildID(), TemplateID: t.ID, Status: StatusWaiting, Tags: tags, CPUCount: cpu, MemoryMB: mem,
		KeyID: c.P.Key, CreatedAt: now, UpdatedAt: now}
	b.StoreName = storeName(t.ID, b.ID)
	if err := s.cfg.Store.PutBuild(ctx, b); err != nil {
		return Requested{}, err
	}
	if s.cfg.Shared != nil {
		// Recorded before the answer: the build's next call may come
		// through another gateway, which routes it by the record.
		if err := s.cfg.Shared.Building(ctx, t, b); err != nil {
			return Requested{}, fmt.Errorf("record the build in the cluster: %w", err)
		}
		if err := s.cfg.Store.SetAPITemplateShared(ctx, t.ID); err != nil {
			return Requested{}, err
		}
	}
	// An older build the client never started is superseded (E2B's
	// InvalidateUnstartedTemplateBuilds).
	if _, err := s.cfg.Store.FailBuilds(ctx, t.ID, []string{StatusWaiting}, b.ID, ReasonSuperseded); err != nil {
		return Requested{}, err
	}
	return Requested{TemplateID: t.ID, BuildID: b.ID, Names: s.names(ctx, t), Aliases: []string{t.Alias}, Tags: tags, Public: t.Public}, nil
}

// templateFor returns the caller's template of this alias, making it if
// the alias is free; an alias another team uses, or that names a template
// of this machine or a template ID, is a conflict.
func (s *Service) templateFor(ctx context.Context, c Caller, alias string) (store.APITemplate, error) {
	for range 2 {
		t, err := s.cfg.Store.GetAPITemplateByAlias(ctx, alias)
		if err == nil {
			if !c.owns(t) {
				return t, errdefs.Conflict("Alias '%s' is already used by another team", alias)
			}
			return t, nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return t, err
		}
		if _, err := s.cfg.Store.GetAPITemplate(ctx, alias); err == nil {
			return t, errdefs.Conflict("Alias '%s' is already used (it is a template ID)", alias)
		}
		if template.IsBuiltin(alias) {
			return t, errdefs.Conflict("Alias '%s' is already used (by a builtin template)", alias)
		}
		if _, err := s.cfg.Templates.Get(alias); err == nil {
			return t, errdefs.Conflict("Alias '%s' is already used (by a template of this machine: cella template ls)", alias)
		}
		// On a cluster node the alias may be the team's on another node
		// already: a rebuild here keeps its template ID.
		id, err := s.sharedAlias(ctx, c, alias, store.NewID())
		if err != nil {
			return t, err
		}
		now := time.Now()
		t = store.APITemplate{ID: id, Alias: alias, TeamID: c.P.Team, KeyID: c.P.Key, CreatedAt: now, UpdatedAt: now}
		err = s.cfg.Store.PutAPITemplate(ctx, t)
		if err == nil {
			return t, nil
		}
		if !errors.Is(err, store.ErrExists) {
			return t, err
		}
		// Another request made it meanwhile: look again.
	}
	return store.APITemplate{}, errdefs.Conflict("Alias '%s' is being created by another request; retry", alias)
}

// templateBuild returns a build of the template (ID or alias) the caller
// owns (sees, for reads); an unknown or foreign one is E2B's 400 "Build
// '<id>' not found" (status) or a 404 (trigger): notFound says which.
func (s *Service) templateBuild(ctx context.Context, c Caller, templateID, buildID string, owned bool, notFound func(string, ...any) error) (store.APITemplate, store.Build, error) {
	t, _, err := s.findTemplate(ctx, c, templateID, owned)
	if err != nil {
		return t, store.Build{}, notFound("Build '%s' not found", buildID)
	}
	b, err := s.cfg.Store.GetBuild(ctx, buildID)
	if errors.Is(err, store.ErrNotFound) || err == nil && b.TemplateID != t.ID {
		return t, b, notFound("Build '%s' not found", buildID)
	}
	return t, b, err
}

// Registry is fromImageRegistry.
type Registry struct {
	Type     string `json:"type"`
	Username string `json:"username"`
	Password string `json:"password"`
}

// Start is E2B's TemplateBuildStartV2.
type Start struct {
	FromImage         string       `json:"fromImage"`
	FromTemplate      string       `json:"fromTemplate"`
	FromImageRegistry *Registry    `json:"fromImageRegistry"`
	Steps             []build.Step `json:"steps"`
	StartCmd          string       `json:"startCmd"`
	ReadyCmd          string       `json:"readyCmd"`
	Force             bool         `json:"force"`
}

// DefaultImage is the SDK's base when a template names none: E2B's base
// image, which is cella's builtin base template.
const DefaultImage = "e2bdev/base"

// StartBuild starts a waiting build in the background. Problems of the
// request itself are errors (400/404/501); problems of the recipe (an
// unknown step type, a COPY without files, a missing base template) fail
// the build at that step, as E2B's builder does.
func (s *Service) StartBuild(ctx context.Context, c Caller, templateID, buildID string, req Start) error {
	t, b, err := s.templateBuild(ctx, c, templateID, buildID, true, errdefs.NotFound)
	if err != nil {
		return err
	}
	if b.Status != StatusWaiting {
		return errdefs.InvalidArgument("build is not in waiting state (it is %s): request a new build with POST /v3/templates", b.Status)
	}
	if (req.FromImage == "") == (req.FromTemplate == "") {
		return errdefs.InvalidArgument("exactly one of fromImage and fromTemplate must be set")
	}
	if s.cfg.Builder == nil {
		return errdefs.NotImplemented("template builds are not configured on this daemon")
	}
	spec := build.Spec{Name: b.StoreName, Force: req.Force, StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd,
		CPUs: b.CPUCount, MemoryMB: b.MemoryMB}
	var fail *build.StepError
	switch {
	case req.FromImage == DefaultImage:
		spec.Base.Template = template.BaseName
	case req.FromImage != "":
		spec.Base.Image = req.FromImage
		if r := req.FromImageRegistry; r != nil {
			if r.Type != "registry" {
				fail = &build.StepError{Step: "base", Message: fmt.Sprintf("fromImageRegistry type %q is not supported by cella (only \"registry\", with username and password)", r.Type)}
			}
			spec.Base.Username, spec.Base.Password = r.Username, r.Password
		}
	default:
		name, err := s.resolveBase(ctx, c, req.FromTemplate)
		if err != nil {
			fail = &build.StepError{Step: "base", Message: err.Error(), Err: err}
		}
		spec.Base.Template = name
	}
	if fail == nil {
		spec.Steps, fail = s.checkSteps(t.TeamID, req.Steps)
	}
	if err := s.cfg.Store.SetBuildStatus(ctx, b.ID, []string{StatusWaiting}, StatusBuilding, "", ""); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return errdefs.InvalidArgument("build is not in waiting state: another request started it")
		}
		return err
	}
	lg := newLogSink(s.cfg.Store, b.ID, 0, s.cfg.MaxLogBytes, s.log)
	s.mu.Lock()
	s.running[b.ID] = lg
	s.mu.Unlock()
	s.wg.Add(1)
	go s.run(c.P, t, b, spec, lg, fail)
	return nil
}

// resolveBase is the template-store name fromTemplate names: an API
// template the caller may use (by alias[:tag] or ID), or a template of
// this machine.
func (s *Service) resolveBase(ctx context.Context, c Caller, ref string) (string, error) {
	name, ours, err := s.Resolve(ctx, c, ref)
	if errdefs.Is(err, errdefs.KindNotFound) {
		// Unknown and foreign alike (Resolve's words name the CLI).
		return "", fmt.Errorf("base template %q not found", ref)
	}
	if err != nil {
		return "", err
	}
	if ours || template.IsBuiltin(name) {
		return name, nil
	}
	if _, err := s.cfg.Templates.Get(name); err != nil {
		return "", fmt.Errorf("base template %q not found", ref)
	}
	return name, nil
}

// checkSteps normalizes the steps' types and checks their arguments; the
// first bad step is the build's failure.
func (s *Service) checkSteps(team string, steps []build.Step) ([]build.Step, *build.StepError) {
	out := make([]build.Step, len(steps))
	for i, st := range steps {
		n := fmt.Sprint(i + 1)
		bad := func(format string, args ...any) ([]build.Step, *build.StepError) {
			return nil, &build.StepError{Step: n, Message: fmt.Sprintf(format, args...)}
		}
		st.Type = strings.ToUpper(st.Type)
		switch st.Type {
		case "ADD":
			st.Type = build.StepCopy
		case "ARG":
			st.Type = build.StepEnv
		}
		switch st.Type {
		case build.StepRun:
			if len(st.Args) < 1 || len(st.Args) > 2 || strings.TrimSpace(st.Args[0]) == "" {
				return bad("RUN takes [command] or [command, user] (got %d arguments)", len(st.Args))
			}
		case build.StepCopy:
			if len(st.Args) < 2 || len(st.Args) > 4 {
				return bad("COPY takes [src, dest, owner, mode] (got %d arguments)", len(st.Args))
			}
			if st.FilesHash == "" {
				return bad("COPY requires files hash to be set")
			}
			if !hashRE.MatchString(st.FilesHash) {
				return bad("COPY files hash %q is not 64 lower-case hex digits", st.FilesHash)
			}
			if _, err := os.Stat(s.filePath(team, st.FilesHash)); err != nil {
				return bad("the files of COPY %s (hash %s) were not uploaded", st.Args[0], st.FilesHash)
			}
		case build.StepEnv:
			if len(st.Args) < 2 || len(st.Args)%2 != 0 {
				return bad("ENV takes pairs [key, value, ...] (got %d arguments)", len(st.Args))
			}
		case build.StepWorkdir:
			if len(st.Args) != 1 || st.Args[0] == "" {
				return bad("WORKDIR takes [path] (got %d arguments)", len(st.Args))
			}
		case build.StepUser:
			if len(st.Args) < 1 || len(st.Args) > 2 || st.Args[0] == "" {
				return bad("USER takes [name] or [name, \"true\"] (got %d arguments)", len(st.Args))
			}
		default:
			return bad("command type %s is not implemented", st.Type)
		}
		out[i] = st
	}
	return out, nil
}

// run is one build in the background. fail, if set, is a recipe error
// found before the engine ran: the build fails with it at once.
func (s *Service) run(p tenant.Principal, t store.APITemplate, b store.Build, spec build.Spec, lg *logSink, fail *build.StepError) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.running, b.ID)
		s.mu.Unlock()
	}()
	// The engine logs the build's first and last lines ("Building
	// template", "Build finished" / "Build failed: ...").
	start := time.Now()
	var err error
	if fail != nil {
		err = fail
		lg.add(build.LogEntry{Level: build.LevelError, Message: "Build failed: " + fail.Message})
	} else {
		_, err = s.cfg.Builder.Build(s.ctx, p, spec, teamFiles{s: s, team: t.TeamID}, lg.add)
	}
	if s.ctx.Err() != nil {
		// The daemon is stopping: the next one fails the build.
		lg.close()
		return
	}
	ctx := context.Background()
	if err == nil && s.cfg.Shared != nil {
		// Shared before it is ready: a create through any gateway may
		// land on another node the moment the client sees "ready".
		logf := func(msg string) { lg.add(build.LogEntry{Level: build.LevelInfo, Message: msg, Step: "finalize"}) }
		// Without a default tag a template's name is its newest ready
		// build (resolveBuild): this one, once ready.
		_, terr := s.cfg.Store.GetTag(ctx, t.ID, DefaultTag)
		current := slices.Contains(b.Tags, DefaultTag) || errors.Is(terr, store.ErrNotFound)
		if perr := s.cfg.Shared.Publish(ctx, t, b, current, logf); perr != nil {
			err = &build.StepError{Step: "finalize", Message: perr.Error(), Err: perr}
			lg.add(build.LogEntry{Level: build.LevelError, Message: "Build failed: " + perr.Error(), Step: "finalize"})
		}
	}
	if err == nil {
		for _, tag := range b.Tags {
			if err = s.cfg.Store.SetTag(ctx, t.ID, tag, b.ID); err != nil {
				lg.add(build.LogEntry{Level: build.LevelError, Message: "Build failed: " + err.Error()})
				break
			}
		}
	}
	status, reason, step := StatusReady, "", ""
	if err != nil {
		status = StatusError
		var ok bool
		if step, reason, ok = build.FailedStep(err); !ok {
			reason = err.Error()
		}
		s.log.Info("template build failed", "template", t.ID, "build", b.ID, "step", step, "err", err)
	} else {
		s.log.Info("template built", "template", t.ID, "alias", t.Alias, "build", b.ID, "tags", b.Tags, "took", time.Since(start))
	}
	// Every line is stored before the status says the build is over: a
	// client pages until an empty page once it sees ready or error.
	lg.close()
	if err := s.cfg.Store.SetBuildStatus(ctx, b.ID, []string{StatusBuilding}, status, reason, step); err != nil {
		s.log.Error("record build status", "build", b.ID, "err", err)
	}
}

// MaxLogsPage is the most log lines one status answer carries (E2B's).
const MaxLogsPage = 100

// Status is E2B's TemplateBuildInfo.
type Status struct {
	TemplateID, BuildID, Status string
	Logs                        []build.LogEntry
	Reason                      *Reason
}

// Reason is E2B's BuildStatusReason.
type Reason struct {
	Message, Step string
	Logs          []build.LogEntry
}

// Status returns a build's status and one page of its log from offset.
func (s *Service) Status(ctx context.Context, c Caller, templateID, buildID string, offset, limit int) (Status, error) {
	t, b, err := s.templateBuild(ctx, c, templateID, buildID, false, errdefs.InvalidArgument)
	if err != nil {
		return Status{}, err
	}
	s.mu.Lock()
	lg := s.running[b.ID]
	s.mu.Unlock()
	if lg != nil {
		lg.flush()
	}
	if limit <= 0 || limit > MaxLogsPage {
		limit = MaxLogsPage
	}
	rows, err := s.cfg.Store.BuildLogs(ctx, b.ID, offset, limit)
	if err != nil {
		return Status{}, err
	}
	out := Status{TemplateID: t.ID, BuildID: b.ID, Status: b.Status, Logs: []build.LogEntry{}}
	for _, r := range rows {
		out.Logs = append(out.Logs, build.LogEntry{Time: r.Time, Level: r.Level, Message: r.Message, Step: r.Step})
	}
	if b.Status == StatusError {
		out.Reason = &Reason{Message: b.Reason, Step: b.ReasonStep, Logs: []build.LogEntry{}}
		for _, e := range out.Logs {
			if (e.Level == build.LevelWarn || e.Level == build.LevelError) && e.Step == b.ReasonStep && b.ReasonStep != "" {
				out.Reason.Logs = append(out.Reason.Logs, e)
			}
		}
	}
	return out, nil
}

// resolveBuild is the build name's tag points at: the explicit tag, else
// "default", else the newest ready build.
func (s *Service) resolveBuild(ctx context.Context, t store.APITemplate, n Name, ref string) (store.Build, error) {
	tag := n.TagOr(DefaultTag)
	tg, err := s.cfg.Store.GetTag(ctx, t.ID, tag)
	if err == nil {
		return s.cfg.Store.GetBuild(ctx, tg.BuildID)
	}
	if !errors.Is(err, store.ErrNotFound) {
		return store.Build{}, err
	}
	if n.Tag != "" {
		return store.Build{}, errdefs.NotFound("tag '%s' does not exist for template '%s'", n.Tag, t.Alias)
	}
	all, err := s.cfg.Store.ListBuilds(ctx, t.ID)
	if err != nil {
		return store.Build{}, err
	}
	for _, b := range slices.Backward(all) {
		if b.Status == StatusReady {
			return b, nil
		}
	}
	return store.Build{}, errdefs.NotFound("template %q has no finished build yet", ref)
}

// ApplySizes sets, where they are zero, a create's vCPUs and memory to
// what the build named storeName (from Resolve) was requested with.
func (s *Service) ApplySizes(ctx context.Context, storeName string, cpus *float64, memoryMB *int64) error {
	if *cpus != 0 && *memoryMB != 0 {
		return nil
	}
	b, err := s.cfg.Store.GetBuildByStoreName(ctx, storeName)
	if err != nil {
		return fmt.Errorf("reading the build of template %s: %w", storeName, err)
	}
	if *cpus == 0 {
		*cpus = float64(b.CPUCount)
	}
	if *memoryMB == 0 {
		*memoryMB = int64(b.MemoryMB)
	}
	return nil
}

// Resolve is the template-store name a sandbox create or a fromTemplate
// naming ref starts from: for an API template (ID, alias, alias:tag,
// namespace/alias[:tag], or one of its builds' store names) the caller may
// use, its build's store name and ours=true; a foreign private one answers
// what an unknown one does. Any other ref is returned as it is, ours=false.
//
// On a cluster node a template of the cluster this node lacks is pulled
// first (shared.go).
func (s *Service) Resolve(ctx context.Context, c Caller, ref string) (name string, ours bool, err error) {
	if s.cfg.Shared != nil && !localOnly(ref) {
		if name, handled, err := s.resolveShared(ctx, c, ref); handled {
			return name, true, err
		}
	}
	return s.ResolveHere(ctx, c, ref)
}

// ResolveHere is Resolve among this node's templates only: what a listing
// describes, which must never pull.
func (s *Service) ResolveHere(ctx context.Context, c Caller, ref string) (name string, ours bool, err error) {
	if IsStoreName(ref) {
		b, err := s.cfg.Store.GetBuildByStoreName(ctx, ref)
		if err != nil {
			return ref, true, unknownTemplate(ref)
		}
		t, err := s.cfg.Store.GetAPITemplate(ctx, b.TemplateID)
		if err != nil || !c.sees(t) {
			return ref, true, unknownTemplate(ref)
		}
		return ref, true, nil
	}
	t, err := s.cfg.Store.GetAPITemplate(ctx, ref)
	n := Name{Alias: ref}
	if errors.Is(err, store.ErrNotFound) {
		var perr error
		if n, perr = ParseName(ref); perr != nil {
			return ref, false, nil
		}
		t, err = s.cfg.Store.GetAPITemplateByAlias(ctx, n.Alias)
	}
	if errors.Is(err, store.ErrNotFound) {
		if n.Tag != "" || n.Namespace != "" {
			// Only E2B's names have these: no template of this machine
			// can be meant.
			return ref, true, unknownTemplate(ref)
		}
		return ref, false, nil
	}
	if err != nil {
		return ref, true, err
	}
	if !c.sees(t) {
		return ref, true, unknownTemplate(ref)
	}
	b, err := s.resolveBuild(ctx, t, n, ref)
	if err != nil {
		return ref, true, err
	}
	return b.StoreName, true, nil
}

// unknownTemplate is the sandbox manager's answer for a template it does
// not know, word for word: a foreign private template must not be told
// apart from an unknown one.
func unknownTemplate(name string) error {
	return errdefs.NotFound("template %q not found (build it with: cella template build %s ...)", name, name)
}

// AliasInfo answers GET /templates/aliases/{alias}.
type AliasInfo struct {
	TemplateID string
	Public     bool
}

// Alias says whether an alias exists for the caller: an API template it
// may see (with the tag, if one is given), or a template of this machine.
func (s *Service) Alias(ctx context.Context, c Caller, raw string) (AliasInfo, error) {
	n, err := ParseName(raw)
	if err != nil {
		return AliasInfo{}, err
	}
	if err := checkNamespace(c, n, raw); err != nil {
		return AliasInfo{}, err
	}
	t, err := s.cfg.Store.GetAPITemplateByAlias(ctx, n.Alias)
	if err == nil && c.sees(t) {
		if n.Tag != "" {
			if _, err := s.cfg.Store.GetTag(ctx, t.ID, n.Tag); err != nil {
				return AliasInfo{}, errdefs.NotFound("tag '%s' does not exist for template '%s'", n.Tag, n.Alias)
			}
		}
		return AliasInfo{TemplateID: t.ID, Public: t.Public}, nil
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return AliasInfo{}, err
	}
	if err != nil && n.Tag == "" && n.Namespace == "" {
		if _, gerr := s.cfg.Templates.Get(n.Alias); gerr == nil || template.IsBuiltin(n.Alias) {
			return AliasInfo{TemplateID: n.Alias, Public: true}, nil
		}
	}
	return AliasInfo{}, errdefs.NotFound("Template alias '%s' not found", n.Alias)
}

// AssignTags points tags at the build target (alias[:tag]) names.
func (s *Service) AssignTags(ctx context.Context, c Caller, target string, tags []string) (string, []string, error) {
	n, err := ParseName(target)
	if err != nil {
		return "", nil, err
	}
	tags, err = validTags(tags)
	if err != nil {
		return "", nil, err
	}
	if len(tags) == 0 {
		return "", nil, errdefs.InvalidArgument("tags must name at least one tag")
	}
	t, _, err := s.findTemplate(ctx, c, n.Alias, true)
	if err != nil {
		return "", nil, err
	}
	src := n.TagOr(DefaultTag)
	if s.cfg.Shared != nil && t.Shared {
		// The cluster's record is what every node resolves a tag by: it
		// changes first; this node's own tags follow where it has the
		// build.
		id, err := s.cfg.Shared.AssignTags(ctx, t.ID, src, tags)
		if errdefs.Is(err, errdefs.KindNotFound) {
			return "", nil, errdefs.NotFound("Template '%s' with tag '%s' not found", n.Alias, src)
		}
		if err != nil {
			return "", nil, err
		}
		if _, err := s.cfg.Store.GetBuild(ctx, id); err == nil {
			for _, tag := range tags {
				if err := s.cfg.Store.SetTag(ctx, t.ID, tag, id); err != nil {
					return "", nil, err
				}
			}
		}
		return id, tags, nil
	}
	b, err := s.resolveBuild(ctx, t, n, target)
	if err != nil {
		return "", nil, errdefs.NotFound("Template '%s' with tag '%s' not found", n.Alias, src)
	}
	for _, tag := range tags {
		if err := s.cfg.Store.SetTag(ctx, t.ID, tag, b.ID); err != nil {
			return "", nil, err
		}
	}
	return b.ID, tags, nil
}

// RemoveTags removes tags of the template name (an alias, without a tag).
func (s *Service) RemoveTags(ctx context.Context, c Caller, name string, tags []string) error {
	n, err := ParseName(name)
	if err != nil {
		return err
	}
	if n.Tag != "" {
		return errdefs.InvalidArgument("name %q must not contain a tag: the tags to remove go in tags", name)
	}
	tags, err = validTags(tags)
	if err != nil {
		return err
	}
	if len(tags) == 0 {
		return errdefs.InvalidArgument("tags must name at least one tag")
	}
	if slices.Contains(tags, DefaultTag) {
		return errdefs.InvalidArgument("the %q tag cannot be removed", DefaultTag)
	}
	t, _, err := s.findTemplate(ctx, c, n.Alias, true)
	if err != nil {
		return err
	}
	if s.cfg.Shared != nil && t.Shared {
		// The record first: it says which tags exist cluster-wide.
		st, err := s.cfg.Shared.Lookup(ctx, Caller{P: tenant.System}, t.ID, "")
		if err != nil {
			return err
		}
		for _, tag := range tags {
			if _, ok := st.tag(tag); !ok {
				return errdefs.NotFound("tag '%s' does not exist for template '%s'", tag, n.Alias)
			}
		}
		if err := s.cfg.Shared.RemoveTags(ctx, t.ID, tags); err != nil {
			return err
		}
	} else {
		for _, tag := range tags {
			if _, err := s.cfg.Store.GetTag(ctx, t.ID, tag); err != nil {
				return errdefs.NotFound("tag '%s' does not exist for template '%s'", tag, n.Alias)
			}
		}
	}
	for _, tag := range tags {
		if err := s.cfg.Store.DeleteTag(ctx, t.ID, tag); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	return nil
}

// Tags lists a template's tags (by ID or name).
func (s *Service) Tags(ctx context.Context, c Caller, ref string) ([]store.Tag, error) {
	t, _, err := s.findTemplate(ctx, c, ref, false)
	if err != nil {
		return nil, err
	}
	return s.cfg.Store.ListTags(ctx, t.ID)
}

// Info is one API template for listings (E2B's Template).
type Info struct {
	store.APITemplate
	Names      []string
	Latest     store.Build // the newest build (ID "" without one)
	BuildCount int
}

// List returns the API templates the caller may see.
func (s *Service) List(ctx context.Context, c Caller) ([]Info, error) {
	all, err := s.cfg.Store.ListAPITemplates(ctx)
	if err != nil {
		return nil, err
	}
	var out []Info
	for _, t := range all {
		if !c.sees(t) {
			continue
		}
		bs, err := s.cfg.Store.ListBuilds(ctx, t.ID)
		if err != nil {
			return nil, err
		}
		in := Info{APITemplate: t, Names: s.names(ctx, t), BuildCount: len(bs)}
		if len(bs) > 0 {
			in.Latest = bs[len(bs)-1]
		}
		out = append(out, in)
	}
	return out, nil
}

// Delete removes the caller's template (ID or alias), its builds' images
// and its records; held, if not nil, says why a build's store name must
// stay (a warm pool keeps sandboxes of it), refusing the delete before
// anything is removed. ours=false: ref is no API template of the caller's.
func (s *Service) Delete(ctx context.Context, c Caller, ref string, held func(storeName string) error) (ours bool, err error) {
	t, _, err := s.findTemplate(ctx, c, ref, true)
	if err != nil {
		return false, nil
	}
	bs, err := s.cfg.Store.ListBuilds(ctx, t.ID)
	if err != nil {
		return true, err
	}
	for _, b := range bs {
		if b.Status == StatusBuilding {
			return true, errdefs.Conflict("template %q has a build in progress (%s): wait for it to end", t.Alias, b.ID)
		}
		if held != nil {
			if err := held(b.StoreName); err != nil {
				return true, err
			}
		}
	}
	for _, b := range bs {
		err := s.cfg.Templates.Delete(b.StoreName)
		var inUse *template.InUseError
		switch {
		case errors.As(err, &inUse):
			return true, errdefs.InvalidArgument("template %q is used by %d sandbox(es) (%s): kill them first (build %s)", t.Alias,
				len(inUse.Sandboxes), strings.Join(inUse.Sandboxes, ", "), b.ID)
		case errors.Is(err, template.ErrInUse):
			return true, errdefs.InvalidArgument("template %q is used by sandboxes: kill them first (build %s)", t.Alias, b.ID)
		case err != nil && !errors.Is(err, template.ErrNotFound):
			return true, fmt.Errorf("delete template %s: %w", t.Alias, err)
		}
	}
	if err := s.cfg.Store.DeleteAPITemplate(ctx, t.ID); err != nil {
		return true, err
	}
	if s.cfg.Shared != nil {
		if err := s.cfg.Shared.Deleted(ctx, t.ID); err != nil {
			return true, fmt.Errorf("delete the cluster's record of template %s: %w", t.ID, err)
		}
	}
	return true, nil
}

// SetPublic publishes (or unpublishes) the caller's template; it returns
// its names.
func (s *Service) SetPublic(ctx context.Context, c Caller, ref string, public bool) ([]string, error) {
	t, _, err := s.findTemplate(ctx, c, ref, true)
	if err != nil {
		return nil, err
	}
	if err := s.cfg.Store.SetAPITemplatePublic(ctx, t.ID, public); err != nil {
		return nil, err
	}
	if s.cfg.Shared != nil {
		if err := s.cfg.Shared.Published(ctx, t.ID, public); err != nil {
			return nil, fmt.Errorf("record the template's publication in the cluster: %w", err)
		}
	}
	return s.names(ctx, t), nil
}
