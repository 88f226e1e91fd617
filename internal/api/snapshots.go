package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/cella-sandbox/cella/internal/builds"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/sandbox"
)

func (s *Server) snapshotRoutes(auth func(http.HandlerFunc) http.Handler) {
	s.mux.Handle("POST /sandboxes/{id}/snapshots", auth(s.createSnapshot))
	s.mux.Handle("GET /snapshots", auth(s.listSnapshots))
	s.mux.Handle("DELETE /templates/{id}", auth(s.deleteTemplate))
	s.mux.Handle("POST /sandboxes/{id}/fork", auth(s.forkSandbox))
}

// snapshotInfo is E2B's SnapshotInfo plus cella's fields.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`

	// cella's own fields.
	SandboxID  string    `json:"sandboxID"`
	TemplateID string    `json:"templateID"`
	CreatedAt  time.Time `json:"createdAt"`
	// Memory: sandboxes made from it go on with the original's processes
	// (gVisor); false: they boot fresh on its files (namespaces runtime).
	Memory    bool  `json:"memory"`
	SizeBytes int64 `json:"sizeBytes"`
	TookMS    int64 `json:"tookMs,omitempty"`
}

func snapshotBody(in sandbox.SnapshotInfo) snapshotInfo {
	return snapshotInfo{SnapshotID: in.ID, Names: in.Names, SandboxID: in.SandboxID, TemplateID: in.TemplateID,
		CreatedAt: in.CreatedAt, Memory: in.Memory, SizeBytes: in.SizeBytes, TookMS: in.Took.Milliseconds()}
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	name, err := parseSnapshot(r) // bodies.go
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	in, err := s.cfg.Manager.Snapshot(r.Context(), caller(r), r.PathValue("id"), name)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotBody(in))
}

const maxSnapshotPage = 100

// listSnapshots is GET /snapshots?sandboxID=&name=&limit=&nextToken=; the
// next token is the offset of the next page, sent in X-Next-Token.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, offset, err := parseSnapshotPage(q) // bodies.go
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	all, err := s.cfg.Manager.ListSnapshots(r.Context(), caller(r), sandbox.SnapshotFilter{SandboxID: q.Get("sandboxID"), Name: q.Get("name")})
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := []snapshotInfo{}
	for i := offset; i < len(all) && len(out) < limit; i++ {
		out = append(out, snapshotBody(all[i]))
	}
	if next := offset + len(out); next < len(all) {
		w.Header().Set("X-Next-Token", strconv.Itoa(next))
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteTemplate is E2B's DELETE /templates/{id}, which the SDK's
// deleteSnapshot and `e2b template delete` call: snapshots and templates
// built over the API are deleted; this machine's templates are managed
// with `cella template`.
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if s.cfg.Manager.IsSnapshot(r.Context(), caller(r), id) {
		if err := s.cfg.Manager.DeleteSnapshot(r.Context(), caller(r), id); err != nil {
			s.writeErr(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if s.cfg.Builds != nil { // a template built over the API (templatebuilds.go)
		if ours, err := s.cfg.Builds.Delete(r.Context(), buildCaller(r), id); ours {
			if err != nil {
				s.writeErr(w, r, err)
				return
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	if s.cfg.Templates != nil && !builds.IsStoreName(id) {
		if _, err := s.cfg.Templates.Get(id); err == nil {
			s.writeErr(w, r, errdefs.NotImplemented("template %q cannot be deleted over the API (use: cella template rm)", id))
			return
		}
	}
	s.writeErr(w, r, errdefs.NotFound("snapshot or template %q not found", id))
}

// forkResult is one element of E2B's fork answer: a sandbox or an error.
type forkResult struct {
	Sandbox *forkedSandbox `json:"sandbox,omitempty"`
	Error   *errorBody     `json:"error,omitempty"`
}

type forkedSandbox struct {
	sandboxResponse
	// cella: whether the fork goes on with the original's processes
	// (gVisor memory restore) or booted fresh on its files (namespaces).
	MemoryRestored bool `json:"memoryRestored"`
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) {
	count, timeout, err := parseFork(r) // bodies.go
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if err := s.takeCreates(r, count); err != nil { // quotas.go
		s.writeErr(w, r, err)
		return
	}
	res, err := s.cfg.Manager.Fork(r.Context(), caller(r), r.PathValue("id"), count, timeout)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := make([]forkResult, 0, len(res))
	for _, f := range res {
		if f.Err != nil {
			st := errdefs.HTTPStatus(f.Err)
			out = append(out, forkResult{Error: &errorBody{Code: st, Message: f.Err.Error()}})
			continue
		}
		_, mem := s.cfg.Manager.SnapshotOrigin(f.Sandbox)
		s.creates.add(time.Now(), 1) // overview.go
		out = append(out, forkResult{Sandbox: &forkedSandbox{sandboxResponse: s.sandboxBody(f.Sandbox.Info()), MemoryRestored: mem}})
	}
	writeJSON(w, http.StatusCreated, out)
}
