package api

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"

	"github.com/cella-sandbox/cella/internal/apiwire"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/volume"
)

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

func (s *Server) volumeRoutes(auth func(http.HandlerFunc) http.Handler) {
	m := s.mux
	m.Handle("POST /volumes", auth(s.createVolume))
	m.Handle("GET /volumes", auth(s.listVolumes))
	m.Handle("GET /volumes/{name}", auth(s.getVolume))
	m.Handle("DELETE /volumes/{name}", auth(s.deleteVolume))
	s.volumeContentRoutes() // volumecontent.go
}

// volumeBody shows v to the caller, with the sandboxes that mount it that
// the caller may see.
func (s *Server) volumeBody(r *http.Request, v volume.Volume) apiwire.Volume {
	users := []string{}
	for _, id := range s.cfg.Manager.VolumeUsers(v.ID) {
		if _, err := s.cfg.Manager.Lookup(caller(r), id); err == nil {
			users = append(users, id)
		}
	}
	return apiwire.Volume{VolumeID: v.ID, Name: v.Name, SizeMB: v.SizeBytes >> 20, UsedBytes: v.UsedBytes,
		Mounted: v.Mounted, CreatedAt: v.CreatedAt, UsedBy: users}
}

func (s *Server) volumes(w http.ResponseWriter, r *http.Request) Volumes {
	if s.cfg.Volumes == nil {
		s.writeErr(w, r, errdefs.NotImplemented("this daemon has no volume store"))
		return nil
	}
	return s.cfg.Volumes
}

// parseSize reads "512M", "2G", "1024" (MiB) or "1GiB".
func parseSize(v string) (int64, error) {
	u := strings.ToUpper(strings.TrimSpace(v))
	u = strings.TrimSuffix(strings.TrimSuffix(u, "B"), "I")
	mult := int64(1 << 20)
	switch {
	case strings.HasSuffix(u, "T"):
		mult, u = 1<<40, strings.TrimSuffix(u, "T")
	case strings.HasSuffix(u, "G"):
		mult, u = 1<<30, strings.TrimSuffix(u, "G")
	case strings.HasSuffix(u, "M"):
		u = strings.TrimSuffix(u, "M")
	}
	n, err := strconv.ParseInt(u, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, errdefs.InvalidArgument("invalid size %q (use e.g. 512M or 2G)", v)
	}
	return n * mult, nil
}

// createVolume is POST /volumes {"name", "sizeMB"? | "size"?: "1G"}: 201.
func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	vm := s.volumes(w, r)
	if vm == nil {
		return
	}
	name, size, err := parseVolumeCreate(r) // bodies.go
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	v, err := vm.Create(r.Context(), caller(r).Owner(), name, size)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	body := s.volumeBody(r, v)
	body.Token = v.Token
	writeJSON(w, http.StatusCreated, body)
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	vm := s.volumes(w, r)
	if vm == nil {
		return
	}
	vs, err := vm.List(r.Context(), caller(r))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := make([]apiwire.Volume, 0, len(vs))
	for _, v := range vs {
		out = append(out, s.volumeBody(r, v))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	vm := s.volumes(w, r)
	if vm == nil {
		return
	}
	v, err := vm.Get(r.Context(), caller(r), r.PathValue("name"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	body := s.volumeBody(r, v)
	body.Token = v.Token
	writeJSON(w, http.StatusOK, body)
}

// deleteVolume is DELETE /volumes/{name}: 204; 409 while a live sandbox
// (running or paused) mounts it.
func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	vm := s.volumes(w, r)
	if vm == nil {
		return
	}
	if err := vm.Delete(r.Context(), caller(r), r.PathValue("name"), s.cfg.Manager.VolumeUsers); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
