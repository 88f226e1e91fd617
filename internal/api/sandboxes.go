package api

import (
	"encoding/json"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/apiwire"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/sandbox"
)

// newSandboxRequest is E2B's NewSandbox / NewSandboxV2 plus cella's limit
// fields. Unknown fields are accepted: newer SDKs add them.
type newSandboxRequest struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             json.RawMessage   `json:"network"`
	AutoPause           bool              `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	VolumeMounts json.RawMessage `json:"volumeMounts"`
	Lifecycle    json.RawMessage `json:"lifecycle"` // cella: lifecycle.go
	Secure       *bool           `json:"secure"`
	MCP          json.RawMessage `json:"mcp"`

	// cella extensions.
	// SecretEnvVars puts secrets in the environment (env var → secret
	// name): weaker than header rules, so it is asked for by name.
	SecretEnvVars map[string]string `json:"secretEnvVars"`
	CPUCount      float64           `json:"cpuCount"`
	MemoryMB      int64             `json:"memoryMB"`
	DiskSizeMB    int64             `json:"diskSizeMB"`
	PidsLimit     int64             `json:"pidsLimit"`
	OutputMB      int64             `json:"outputLimitMB"`
}

// sandboxResponse is E2B's Sandbox.
type sandboxResponse struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    *string `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             string  `json:"domain"`
}

const clientID = "cella"

// v1DefaultTimeout is E2B's default of POST /sandboxes without a timeout.
const v1DefaultTimeout = 15 * time.Second

func (s *Server) sandboxBody(in sandbox.Info) sandboxResponse {
	return sandboxResponse{
		SandboxID: in.ID, TemplateID: in.TemplateID, Alias: in.TemplateID, ClientID: clientID,
		EnvdVersion: agentapi.Version, EnvdAccessToken: envdTokenPtr(in), Domain: s.cfg.Domain,
		TrafficAccessToken: trafficTokenPtr(in.Options), // traffic.go
	}
}

// createOptions reads a create request into the options the manager
// normalizes, the lifecycle defaulting to the daemon's: everything
// createSandbox does before it creates (fuzz_test.go).
func (s *Server) createOptions(r *http.Request, lifecycleDefaults sandbox.Lifecycle) (sandbox.Options, error) {
	var req newSandboxRequest
	if err := decodeBody(r, &req); err != nil {
		return sandbox.Options{}, err
	}
	opts := sandbox.Options{
		TemplateID: req.TemplateID, Metadata: req.Metadata, EnvVars: req.EnvVars,
		AllowInternetAccess: req.AllowInternetAccess, Network: req.Network, AutoPause: req.AutoPause, AutoPauseMemory: req.AutoPauseMemory,
		VolumeMounts: req.VolumeMounts, CPUs: req.CPUCount, MemoryMB: req.MemoryMB, DiskMB: req.DiskSizeMB,
		Pids: req.PidsLimit, OutputMB: req.OutputMB,
	}
	if req.AutoResume != nil {
		opts.AutoResume = req.AutoResume.Enabled
	}
	opts.TrafficAccessToken = trafficTokenFor(req.Network) // traffic.go
	opts.Insecure = req.Secure != nil && !*req.Secure      // traffic.go
	var err error
	if opts.MaskRequestHost, err = maskRequestHostFor(req.Network); err != nil { // traffic.go
		return sandbox.Options{}, err
	}
	if len(req.SecretEnvVars) > 0 {
		if err := s.checkSecretEnv(r, req.SecretEnvVars); err != nil { // network.go
			return sandbox.Options{}, err
		}
		opts.SecretEnv = req.SecretEnvVars
	}
	if s.cfg.EgressCeiling != nil {
		var err error
		if opts.Egress, err = s.requestEgress(r, req.AllowInternetAccess, req.Network); err != nil { // network.go
			return sandbox.Options{}, err
		}
	}
	if req.Timeout != nil {
		var err error
		if opts.Timeout, err = seconds("timeout", *req.Timeout, sandbox.MaxTimeout); err != nil { // bounds.go
			return sandbox.Options{}, err
		}
	} else if r.URL.Path == "/sandboxes" {
		// E2B's v1 NewSandbox defaults to 15 s; v2 defaults to 300 s.
		opts.Timeout = v1DefaultTimeout
	}
	if err := applyVolumeMounts(&opts, req.VolumeMounts); err != nil { // lifecycle.go
		return sandbox.Options{}, err
	}
	if err := applyLifecycle(&opts, req.Lifecycle, lifecycleDefaults); err != nil {
		return sandbox.Options{}, err
	}
	return opts, nil
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	opts, err := s.createOptions(r, s.cfg.Manager.LifecycleDefaults())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if err := s.takeCreates(r, 1); err != nil { // quotas.go
		s.writeErr(w, r, err)
		return
	}
	if s.cfg.Builds != nil { // a template built over the API: its build (templatebuilds.go)
		name, ours, err := s.cfg.Builds.Resolve(r.Context(), buildCaller(r), opts.TemplateID)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		if ours {
			opts.TemplateID = name
			// E2B's sandboxes are the size their template was built with
			// (cpuCount, memoryMB of POST /v3/templates); cella's create may
			// still ask for another.
			if err := s.cfg.Builds.ApplySizes(r.Context(), name, &opts.CPUs, &opts.MemoryMB); err != nil {
				s.writeErr(w, r, err)
				return
			}
		}
	}
	sb, err := s.cfg.Manager.Create(r.Context(), caller(r), opts)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	noteSandbox(r, sb.ID)        // accesslog.go
	s.creates.add(time.Now(), 1) // overview.go
	writeJSON(w, http.StatusCreated, s.sandboxBody(sb.Info()))
}

// sandboxDetail is E2B's SandboxDetail plus cella's fields. Not
// apiwire.SandboxDetail, nor sandboxResponse apiwire.Sandbox: envdAccessToken
// is null for a sandbox created with secure false, which the generated
// string cannot say.
type sandboxDetail struct {
	sandboxResponse
	Metadata            map[string]string                  `json:"metadata"`
	AllowInternetAccess bool                               `json:"allowInternetAccess"`
	StartedAt           time.Time                          `json:"startedAt"`
	EndAt               time.Time                          `json:"endAt"`
	State               string                             `json:"state"`
	CPUCount            float64                            `json:"cpuCount"`
	MemoryMB            int64                              `json:"memoryMB"`
	DiskSizeMB          int64                              `json:"diskSizeMB"`
	Network             apiwire.SandboxNetworkInfo         `json:"network"`
	Lifecycle           apiwire.SandboxLifecycle           `json:"lifecycle"`
	VolumeMounts        []apiwire.SandboxVolumeMountDetail `json:"volumeMounts"`

	// cella's own fields.
	Runtime       string `json:"runtime"`
	PidsLimit     int64  `json:"pidsLimit"`
	OutputLimitMB int64  `json:"outputLimitMB"`
	DiskUsedBytes int64  `json:"diskUsedBytes"`
	Error         string `json:"error,omitempty"`
	// PauseMode says how a paused sandbox keeps its state: "checkpoint"
	// (memory saved to disk), "frozen" (memory kept in RAM) or "stopped"
	// (filesystem only).
	PauseMode string `json:"pauseMode,omitempty"`

	// NextTransition is the next automatic lifecycle step (lifecycle.go).
	NextTransition *apiwire.SandboxTransition `json:"nextTransition"`
}

func (s *Server) detail(in sandbox.Info) sandboxDetail {
	md := in.Options.Metadata
	if md == nil {
		md = map[string]string{}
	}
	allowInternet := in.Options.Egress != nil && len(in.Options.Egress.AllowOut) > 0
	if in.Options.AllowInternetAccess != nil {
		allowInternet = *in.Options.AllowInternetAccess
	}
	return sandboxDetail{
		sandboxResponse: s.sandboxBody(in),
		Metadata:        md,
		StartedAt:       in.StartedAt, EndAt: in.EndAt, State: in.State,
		CPUCount: in.Options.CPUs, MemoryMB: in.Options.MemoryMB, DiskSizeMB: in.Options.DiskMB,
		AllowInternetAccess: allowInternet,
		Network:             networkInfoOf(in.Options.Network, in.Options.Egress, s.cfg.EgressCeiling != nil), // network.go
		Lifecycle:           lifecycleOf(in),
		VolumeMounts:        volumeMountsOf(in),
		Runtime:             in.Runtime, PidsLimit: in.Options.Pids, OutputLimitMB: in.Options.OutputMB, DiskUsedBytes: in.DiskUsedBytes, Error: in.Error,
		PauseMode: in.PauseMode, NextTransition: nextTransitionOf(in),
	}
}

func onTimeout(o sandbox.Options) string {
	if o.AutoPause {
		return "pause"
	}
	return "kill"
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.cfg.Manager.Lookup(caller(r), r.PathValue("id"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.detail(sb.Info()))
}

func (s *Server) killSandbox(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Manager.Kill(r.Context(), caller(r), r.PathValue("id")); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	d, err := parseSetTimeout(r) // bodies.go
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if err := s.cfg.Manager.SetTimeout(r.Context(), caller(r), r.PathValue("id"), d); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	d, err := parseRefresh(r) // bodies.go
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if _, err := s.cfg.Manager.Extend(r.Context(), caller(r), r.PathValue("id"), d); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) connectSandbox(w http.ResponseWriter, r *http.Request) {
	d, keepMemory, err := parseConnect(r) // bodies.go
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	sb, resumed, err := s.cfg.Manager.Connect(r.Context(), caller(r), r.PathValue("id"), d, keepMemory)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.sandboxBody(sb.Info()))
}

// pauseSandbox is POST /sandboxes/{id}/pause {"memory"?: bool}: 204, 409
// when already paused.
func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	keepMemory, err := parsePause(r) // bodies.go
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if err := s.cfg.Manager.Pause(r.Context(), caller(r), r.PathValue("id"), keepMemory); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resumeSandbox is E2B's deprecated POST /sandboxes/{id}/resume
// {"timeout": s, "autoPause": bool}: 201 Sandbox; 409 when not paused.
func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) {
	d, err := parseResume(r) // bodies.go
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	id := r.PathValue("id")
	sb, err := s.cfg.Manager.Lookup(caller(r), id)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if st := sb.State(); st != sandbox.StatePaused {
		s.writeErr(w, r, errdefs.Conflict("sandbox %q is %s, not paused", id, st))
		return
	}
	sb, resumed, err := s.cfg.Manager.Connect(r.Context(), caller(r), id, d, true)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if !resumed {
		s.writeErr(w, r, errdefs.Conflict("sandbox %q was resumed by another request", id))
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxBody(sb.Info()))
}

// listedSandbox is E2B's ListedSandbox.
type listedSandbox struct {
	SandboxID    string                             `json:"sandboxID"`
	TemplateID   string                             `json:"templateID"`
	Alias        string                             `json:"alias,omitempty"`
	ClientID     string                             `json:"clientID"`
	CPUCount     float64                            `json:"cpuCount"`
	MemoryMB     int64                              `json:"memoryMB"`
	DiskSizeMB   int64                              `json:"diskSizeMB"`
	StartedAt    time.Time                          `json:"startedAt"`
	EndAt        time.Time                          `json:"endAt"`
	EnvdVersion  string                             `json:"envdVersion"`
	Metadata     map[string]string                  `json:"metadata"`
	State        string                             `json:"state"`
	VolumeMounts []apiwire.SandboxVolumeMountDetail `json:"volumeMounts"`
	Runtime      string                             `json:"runtime"`
}

func listed(in sandbox.Info) listedSandbox {
	md := in.Options.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return listedSandbox{
		SandboxID: in.ID, TemplateID: in.TemplateID, Alias: in.TemplateID, ClientID: clientID,
		CPUCount: in.Options.CPUs, MemoryMB: in.Options.MemoryMB, DiskSizeMB: in.Options.DiskMB,
		StartedAt: in.StartedAt, EndAt: in.EndAt, EnvdVersion: agentapi.Version, Metadata: md, State: in.State,
		VolumeMounts: volumeMountsOf(in), Runtime: in.Runtime,
	}
}

// parseMetadataFilter decodes E2B's metadata query: the framework has
// decoded it once; the whole string is unescaped again, split on & and =,
// and each key and value unescaped once more.
func parseMetadataFilter(raw string) (map[string]string, error) {
	out := map[string]string{}
	if raw == "" {
		return out, nil
	}
	whole, err := url.QueryUnescape(raw)
	if err != nil {
		return nil, errdefs.InvalidArgument("invalid metadata filter: %v", err)
	}
	for _, pair := range strings.Split(whole, "&") {
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		uk, err1 := url.QueryUnescape(k)
		uv, err2 := url.QueryUnescape(v)
		if err1 != nil || err2 != nil {
			return nil, errdefs.InvalidArgument("invalid metadata filter pair %q", pair)
		}
		out[uk] = uv
	}
	return out, nil
}

func matchesMetadata(md, want map[string]string) bool {
	for k, v := range want {
		if md[k] != v {
			return false
		}
	}
	return true
}

func (s *Server) listSandboxesV1(w http.ResponseWriter, r *http.Request) {
	want, err := parseMetadataFilter(r.URL.Query().Get("metadata"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := []listedSandbox{}
	for _, sb := range s.cfg.Manager.List(caller(r)) {
		in := sb.Info()
		if in.State == sandbox.StateRunning && matchesMetadata(in.Options.Metadata, want) {
			out = append(out, listed(in))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) listSandboxesV2(w http.ResponseWriter, r *http.Request) {
	lq, err := parseListQuery(r.URL.Query()) // bodies.go
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	want, states, tpl, asc, limit, startedAfter := lq.metadata, lq.states, lq.template, lq.asc, lq.limit, lq.startedAfter

	var all []sandbox.Info
	for _, sb := range s.cfg.Manager.List(caller(r)) {
		in := sb.Info()
		if !states[in.State] || !matchesMetadata(in.Options.Metadata, want) {
			continue
		}
		if tpl != "" && in.TemplateID != tpl {
			continue
		}
		if !startedAfter.IsZero() && !in.StartedAt.After(startedAfter) {
			continue
		}
		all = append(all, in)
	}
	sort.Slice(all, func(i, j int) bool {
		less := all[i].StartedAt.Before(all[j].StartedAt) ||
			(all[i].StartedAt.Equal(all[j].StartedAt) && all[i].ID < all[j].ID)
		if asc {
			return less
		}
		return !less
	})
	// The cursor is the last item's position key, so pages stay stable
	// while sandboxes come and go.
	start := 0
	if lq.after {
		n, id := lq.afterNS, lq.afterID
		start = len(all)
		for i, in := range all {
			k := in.StartedAt.UnixNano()
			after := k > n || (k == n && in.ID > id)
			if !asc {
				after = k < n || (k == n && in.ID < id)
			}
			if after {
				start = i
				break
			}
		}
	}
	page := all[start:]
	if len(page) > limit {
		page = page[:limit]
		last := page[len(page)-1]
		w.Header().Set("X-Next-Token", strconv.FormatInt(last.StartedAt.UnixNano(), 10)+"_"+last.ID)
	}
	out := make([]listedSandbox, 0, len(page))
	for _, in := range page {
		out = append(out, listed(in))
	}
	writeJSON(w, http.StatusOK, out)
}

// runningSandbox returns a running sandbox of the caller's or the error to
// answer.
func (s *Server) runningSandbox(r *http.Request, id string) (*sandbox.Sandbox, error) {
	sb, err := s.cfg.Manager.Lookup(caller(r), id)
	if err != nil {
		return nil, err
	}
	if st := sb.State(); st != sandbox.StateRunning {
		return nil, errdefs.Conflict("sandbox %s is %s, not running", id, st)
	}
	return sb, nil
}
