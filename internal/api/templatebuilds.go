package api

import (
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/builds"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// E2B's template build API (../shared/e2b-template-api.md): the routes over
// internal/builds. Path parameters arrive percent-encoded (cella-demo%3Av1,
// acme%2Fdemo); ServeMux matches the escaped path segment by segment and
// PathValue decodes, so "/" and ":" in names reach the handlers whole.
func (s *Server) templateBuildRoutes(auth func(http.HandlerFunc) http.Handler) {
	m := s.mux
	m.Handle("POST /v3/templates", auth(s.requestBuild))
	m.Handle("GET /templates/{templateID}/files/{hash}", auth(s.fileLink))
	// The upload URL authorizes itself (no key): its token is checked.
	m.HandleFunc("PUT /templates/{templateID}/files/{hash}", s.uploadFiles)
	m.Handle("POST /v2/templates/{templateID}/builds/{buildID}", auth(s.startBuild))
	m.Handle("GET /templates/{templateID}/builds/{buildID}/status", auth(s.buildStatus))
	// GET /templates/aliases/{alias} and GET /templates/{templateID}/tags
	// overlap (/templates/aliases/tags matches both), which ServeMux
	// refuses: one pattern serves both, documented as the two.
	m.handleAs([]string{"GET /templates/aliases/{alias}", "GET /templates/{templateID}/tags"},
		"GET /templates/{templateID}/{sub}", auth(s.aliasOrTags))
	m.Handle("POST /templates/tags", auth(s.assignTags))
	m.Handle("DELETE /templates/tags", auth(s.removeTags))
	m.Handle("PATCH /v2/templates/{templateID}", auth(s.publishTemplate))
}

// builds is the build service, or the 501 that says it is missing.
func (s *Server) builds() (*builds.Service, error) {
	if s.cfg.Builds == nil {
		return nil, errdefs.NotImplemented("template builds over the API are not configured on this daemon")
	}
	return s.cfg.Builds, nil
}

func buildCaller(r *http.Request) builds.Caller {
	return builds.Caller{P: caller(r), TeamName: apiKeyFrom(r.Context()).TeamName}
}

// templateRequest is E2B's TemplateBuildRequestV3 (alias and teamID are
// its deprecated fields; minFreeDiskMb is accepted and ignored).
type templateRequest struct {
	Name     string   `json:"name"`
	Alias    string   `json:"alias"`
	Tags     []string `json:"tags"`
	CPUCount *int     `json:"cpuCount"`
	MemoryMB *int     `json:"memoryMB"`
}

type templateRequested struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Names      []string `json:"names"`
	Aliases    []string `json:"aliases"`
	Tags       []string `json:"tags"`
	Public     bool     `json:"public"`
}

func (s *Server) requestBuild(w http.ResponseWriter, r *http.Request) {
	svc, err := s.builds()
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	var req templateRequest
	if err := decodeBody(r, &req); err != nil {
		s.writeErr(w, r, err)
		return
	}
	if req.Name == "" {
		req.Name = req.Alias
	}
	out, err := svc.RequestBuild(r.Context(), buildCaller(r), builds.Request{Name: req.Name, Tags: req.Tags, CPUCount: req.CPUCount, MemoryMB: req.MemoryMB})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, templateRequested{TemplateID: out.TemplateID, BuildID: out.BuildID,
		Names: out.Names, Aliases: out.Aliases, Tags: out.Tags, Public: out.Public})
}

type fileUpload struct {
	Present bool   `json:"present"`
	URL     string `json:"url"`
}

func (s *Server) fileLink(w http.ResponseWriter, r *http.Request) {
	svc, err := s.builds()
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	link, err := svc.FileLink(r.Context(), buildCaller(r), r.PathValue("templateID"), r.PathValue("hash"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	// The URL is the daemon's own, as the client reached it.
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	u := url.URL{Scheme: scheme, Host: r.Host, Path: link.Path, RawQuery: link.Query}
	writeJSON(w, http.StatusCreated, fileUpload{Present: link.Present, URL: u.String()})
}

// uploadFiles is PUT <upload URL>: E2B's SDK sends the tar with no key; the
// token in the query is the credential. 200 with an empty body, as E2B's
// local upload handler answers.
func (s *Server) uploadFiles(w http.ResponseWriter, r *http.Request) {
	svc, err := s.builds()
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if err := svc.Upload(r.Context(), r.PathValue("templateID"), r.PathValue("hash"), r.URL.Query(), r.Body); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) {
	svc, err := s.builds()
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	var req builds.Start
	if err := decodeBody(r, &req); err != nil {
		s.writeErr(w, r, err)
		return
	}
	if err := svc.StartBuild(r.Context(), buildCaller(r), r.PathValue("templateID"), r.PathValue("buildID"), req); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

type buildReason struct {
	Message    string           `json:"message"`
	Step       string           `json:"step,omitempty"`
	LogEntries []build.LogEntry `json:"logEntries"`
}

type buildInfo struct {
	TemplateID string           `json:"templateID"`
	BuildID    string           `json:"buildID"`
	Status     string           `json:"status"`
	LogEntries []build.LogEntry `json:"logEntries"`
	Logs       []string         `json:"logs"`
	Reason     *buildReason     `json:"reason,omitempty"`
}

func (s *Server) buildStatus(w http.ResponseWriter, r *http.Request) {
	svc, err := s.builds()
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	q := r.URL.Query()
	offset := 0
	if v := q.Get("logsOffset"); v != "" {
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 {
			s.writeErr(w, r, errdefs.InvalidArgument("logsOffset must be a non-negative integer (got %q)", v))
			return
		}
	}
	limit, err := intParam(q, "limit", builds.MaxLogsPage, builds.MaxLogsPage)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	st, err := svc.Status(r.Context(), buildCaller(r), r.PathValue("templateID"), r.PathValue("buildID"), offset, limit)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := buildInfo{TemplateID: st.TemplateID, BuildID: st.BuildID, Status: st.Status, LogEntries: st.Logs, Logs: []string{}}
	if st.Reason != nil {
		out.Reason = &buildReason{Message: st.Reason.Message, Step: st.Reason.Step, LogEntries: st.Reason.Logs}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) aliasOrTags(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.PathValue("templateID") == "aliases":
		s.aliasExists(w, r, r.PathValue("sub"))
	case r.PathValue("sub") == "tags":
		s.templateTags(w, r, r.PathValue("templateID"))
	default:
		s.writeErr(w, r, errdefs.NotFound("no such route (see the API section of the README)"))
	}
}

type templateAlias struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
}

func (s *Server) aliasExists(w http.ResponseWriter, r *http.Request, alias string) {
	svc, err := s.builds()
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	in, err := svc.Alias(r.Context(), buildCaller(r), alias)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, templateAlias{TemplateID: in.TemplateID, Public: in.Public})
}

type templateTag struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

func (s *Server) templateTags(w http.ResponseWriter, r *http.Request, ref string) {
	svc, err := s.builds()
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	tags, err := svc.Tags(r.Context(), buildCaller(r), ref)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := []templateTag{}
	for _, t := range tags {
		out = append(out, templateTag{Tag: t.Tag, BuildID: t.BuildID, CreatedAt: t.CreatedAt.UTC()})
	}
	writeJSON(w, http.StatusOK, out)
}

type assignTagsRequest struct {
	Target string   `json:"target"`
	Tags   []string `json:"tags"`
}

type assignedTags struct {
	BuildID string   `json:"buildID"`
	Tags    []string `json:"tags"`
}

func (s *Server) assignTags(w http.ResponseWriter, r *http.Request) {
	svc, err := s.builds()
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	var req assignTagsRequest
	if err := decodeBody(r, &req); err != nil {
		s.writeErr(w, r, err)
		return
	}
	id, tags, err := svc.AssignTags(r.Context(), buildCaller(r), req.Target, req.Tags)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, assignedTags{BuildID: id, Tags: tags})
}

type removeTagsRequest struct {
	Name string   `json:"name"`
	Tags []string `json:"tags"`
}

func (s *Server) removeTags(w http.ResponseWriter, r *http.Request) {
	svc, err := s.builds()
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	var req removeTagsRequest
	if err := decodeBody(r, &req); err != nil {
		s.writeErr(w, r, err)
		return
	}
	if err := svc.RemoveTags(r.Context(), buildCaller(r), req.Name, req.Tags); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type publishRequest struct {
	Public *bool `json:"public"`
}

type publishedTemplate struct {
	Names []string `json:"names"`
}

func (s *Server) publishTemplate(w http.ResponseWriter, r *http.Request) {
	svc, err := s.builds()
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	var req publishRequest
	if err := decodeBody(r, &req); err != nil {
		s.writeErr(w, r, err)
		return
	}
	if req.Public == nil {
		s.writeErr(w, r, errdefs.InvalidArgument("public must be true or false"))
		return
	}
	names, err := svc.SetPublic(r.Context(), buildCaller(r), r.PathValue("templateID"), *req.Public)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, publishedTemplate{Names: names})
}

// templateInfo is E2B's Template, as `e2b template list` reads it.
type templateInfo struct {
	TemplateID    string     `json:"templateID"`
	BuildID       string     `json:"buildID"`
	CPUCount      int        `json:"cpuCount"`
	MemoryMB      int        `json:"memoryMB"`
	DiskSizeMB    int        `json:"diskSizeMB"`
	Public        bool       `json:"public"`
	Aliases       []string   `json:"aliases"`
	Names         []string   `json:"names"`
	CreatedAt     time.Time  `json:"createdAt"`
	UpdatedAt     time.Time  `json:"updatedAt"`
	CreatedBy     *struct{}  `json:"createdBy"`
	LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
	SpawnCount    int        `json:"spawnCount"`
	BuildCount    int        `json:"buildCount"`
	EnvdVersion   string     `json:"envdVersion"`
	BuildStatus   string     `json:"buildStatus"`
	templateStore            // cella's (templateinfo.go)
}

// listTemplates is GET /templates: the API templates the caller may see,
// then this machine's templates (builtins and `cella template build`s:
// public), without the API builds' own store names.
func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	out := []templateInfo{}
	if s.cfg.Builds != nil {
		list, err := s.cfg.Builds.List(r.Context(), buildCaller(r))
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		for _, t := range list {
			status := t.Latest.Status
			if status == "" {
				status = builds.StatusWaiting
			}
			info := templateInfo{TemplateID: t.ID, BuildID: t.Latest.ID, CPUCount: t.Latest.CPUCount, MemoryMB: t.Latest.MemoryMB,
				Public: t.Public, Aliases: []string{t.Alias}, Names: t.Names, CreatedAt: t.CreatedAt.UTC(), UpdatedAt: t.UpdatedAt.UTC(),
				BuildCount: t.BuildCount, EnvdVersion: agentapi.Version, BuildStatus: status}
			// The build a create of it starts from (its default tag, else
			// its newest ready build), as Sandbox.create resolves it.
			if name, _, err := s.cfg.Builds.ResolveHere(r.Context(), buildCaller(r), t.ID); err == nil {
				info.templateStore = s.describeTemplate(name, nil)
			}
			out = append(out, info)
		}
	}
	tpls, err := s.cfg.Templates.List()
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	for _, t := range tpls {
		if builds.IsStoreName(t.Name) {
			continue
		}
		out = append(out, templateInfo{TemplateID: t.Name, BuildID: t.Image, Public: true, Aliases: []string{t.Name}, Names: []string{t.Name},
			CreatedAt: t.Created.UTC(), UpdatedAt: t.Created.UTC(), BuildCount: 1, EnvdVersion: agentapi.Version, BuildStatus: builds.StatusReady,
			templateStore: s.describeTemplate(t.Name, t)})
	}
	writeJSON(w, http.StatusOK, out)
}
