package api

import (
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/tenant"
	"github.com/cella-sandbox/cella/internal/volume"
)

// E2B's standalone volume file API (/volumecontent/{volumeID}/*, the
// SDK's Volume.list/makeDir/getInfo/updateMetadata/readFile/writeFile/
// remove): served by the daemon from the host-mounted volume
// (internal/volume content.go), no sandbox needed. The bearer is the
// volume's token (from POST/GET /volumes), or an API key that may act on
// the volume.
func (s *Server) volumeContentRoutes() {
	m := s.mux
	m.HandleFunc("GET /volumecontent/{id}/dir", s.volumeContent(s.vcList))
	m.HandleFunc("POST /volumecontent/{id}/dir", s.volumeContent(s.vcMakeDir))
	m.HandleFunc("GET /volumecontent/{id}/path", s.volumeContent(s.vcStat))
	m.HandleFunc("PATCH /volumecontent/{id}/path", s.volumeContent(s.vcUpdate))
	m.HandleFunc("DELETE /volumecontent/{id}/path", s.volumeContent(s.vcRemove))
	m.HandleFunc("GET /volumecontent/{id}/file", s.volumeContent(s.vcRead))
	m.HandleFunc("PUT /volumecontent/{id}/file", s.volumeContent(s.vcWrite))
}

// volumeEntry is E2B's VolumeEntryStat.
type volumeEntry struct {
	Name   string    `json:"name"`
	Type   string    `json:"type"`
	Path   string    `json:"path"`
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"`
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Atime  time.Time `json:"atime"`
	Mtime  time.Time `json:"mtime"`
	Ctime  time.Time `json:"ctime"`
	Target string    `json:"target,omitempty"`
}

func entryBody(e volume.Entry) volumeEntry {
	return volumeEntry{Name: e.Name, Type: e.Type, Path: e.Path, Size: e.Size, Mode: e.Mode, UID: e.UID, GID: e.GID,
		Atime: e.Atime, Mtime: e.Mtime, Ctime: e.Ctime, Target: e.Target}
}

// volumeContent authenticates a request for one volume's files and hands
// the opened tree and the query's path to h.
func (s *Server) volumeContent(h func(w http.ResponseWriter, r *http.Request, c *volume.Content, p string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Volumes == nil {
			s.writeErr(w, r, errdefs.NotImplemented("this daemon has no volume store"))
			return
		}
		bearer := r.Header.Get("X-API-Key")
		if a := r.Header.Get("Authorization"); bearer == "" && strings.HasPrefix(a, "Bearer ") {
			bearer = strings.TrimPrefix(a, "Bearer ")
		}
		if bearer == "" {
			s.writeErr(w, r, errdefs.Unauthenticated("missing volume token: send it as Authorization: Bearer <token> (the token of POST or GET /volumes)"))
			return
		}
		var p *tenant.Principal
		if !strings.HasPrefix(bearer, "vtok_") {
			if k, err := s.cfg.Store.LookupAPIKey(r.Context(), bearer); err == nil {
				pr := s.principal(k)
				p = &pr
			}
		}
		c, err := s.cfg.Volumes.OpenContent(r.Context(), r.PathValue("id"), bearer, p)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		defer c.Close()
		path := r.URL.Query().Get("path")
		if path == "" {
			s.writeErr(w, r, errdefs.InvalidArgument("query parameter path is required (e.g. ?path=/dir/file.txt)"))
			return
		}
		h(w, r, c, path)
	}
}

// attrsParam reads uid, gid and mode from the query.
func attrsParam(q url.Values) (volume.Attrs, error) {
	var a volume.Attrs
	for _, f := range []struct {
		name string
		dst  **uint32
	}{{"uid", &a.UID}, {"gid", &a.GID}, {"mode", &a.Mode}} {
		v := q.Get(f.name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return a, errdefs.InvalidArgument("query parameter %s=%q: want an unsigned 32-bit integer", f.name, v)
		}
		u := uint32(n)
		*f.dst = &u
	}
	return a, nil
}

func boolQuery(q url.Values, name string) (bool, error) {
	v := q.Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.InvalidArgument("query parameter %s=%q: want true or false", name, v)
	}
	return b, nil
}

func (s *Server) vcList(w http.ResponseWriter, r *http.Request, c *volume.Content, p string) {
	depth, err := intParam(r.URL.Query(), "depth", 1, volume.MaxListDepth)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	es, err := c.List(p, depth)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := make([]volumeEntry, 0, len(es))
	for _, e := range es {
		out = append(out, entryBody(e))
	}
	writeJSON(w, http.StatusOK, out)
}

// writeOpts reads a write's attrs and force.
func writeOpts(q url.Values) (volume.Attrs, bool, error) {
	a, err := attrsParam(q)
	if err != nil {
		return a, false, err
	}
	force, err := boolQuery(q, "force")
	return a, force, err
}

func (s *Server) vcMakeDir(w http.ResponseWriter, r *http.Request, c *volume.Content, p string) {
	a, force, err := writeOpts(r.URL.Query())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	e, err := c.MakeDir(p, a, force)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, entryBody(e))
}

func (s *Server) vcStat(w http.ResponseWriter, r *http.Request, c *volume.Content, p string) {
	e, err := c.Stat(p)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, entryBody(e))
}

func (s *Server) vcUpdate(w http.ResponseWriter, r *http.Request, c *volume.Content, p string) {
	var a volume.Attrs
	if err := decodeBody(r, &struct {
		UID  **uint32 `json:"uid"`
		GID  **uint32 `json:"gid"`
		Mode **uint32 `json:"mode"`
	}{&a.UID, &a.GID, &a.Mode}); err != nil {
		s.writeErr(w, r, err)
		return
	}
	e, err := c.SetAttrs(p, a)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, entryBody(e))
}

func (s *Server) vcRemove(w http.ResponseWriter, r *http.Request, c *volume.Content, p string) {
	if err := c.Remove(p); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) vcRead(w http.ResponseWriter, r *http.Request, c *volume.Content, p string) {
	f, e, err := c.Open(p)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(e.Size, 10))
	w.WriteHeader(http.StatusOK)
	_, _ = io.CopyN(w, f, e.Size)
}

func (s *Server) vcWrite(w http.ResponseWriter, r *http.Request, c *volume.Content, p string) {
	a, force, err := writeOpts(r.URL.Query())
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	e, err := c.WriteFile(p, r.Body, a, force)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, entryBody(e))
}
