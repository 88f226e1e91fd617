package api

import (
	"net/http"

	"github.com/cella-sandbox/cella/internal/sandbox"
)

// Warm pools (sandbox/pool.go): GET /pools for any key, PUT
// /pools/{template} {"size": N} for the admin key (0 removes the pool).
func (s *Server) poolRoutes(auth func(http.HandlerFunc) http.Handler) {
	s.mux.Handle("GET /pools", auth(s.listPools))
	s.mux.Handle("PUT /pools/{template}", auth(s.adminOnly("size warm pools", s.setPool)))
}

// poolResponse is one template's warm pool.
type poolResponse struct {
	Template  string `json:"template"`
	Size      int    `json:"size"`
	Ready     int    `json:"ready"`
	Filling   int    `json:"filling"`
	HandedOut int64  `json:"handedOut"`
	Misses    int64  `json:"misses"`
	LastError string `json:"lastError"`
}

func poolBody(p sandbox.PoolStatus) poolResponse {
	return poolResponse{Template: p.Template, Size: p.Size, Ready: p.Ready, Filling: p.Filling,
		HandedOut: p.HandedOut, Misses: p.Misses, LastError: p.LastError}
}

func (s *Server) listPools(w http.ResponseWriter, r *http.Request) {
	out := []poolResponse{}
	for _, p := range s.cfg.Pools.Pools() {
		out = append(out, poolBody(p))
	}
	writeJSON(w, http.StatusOK, out)
}

// setPool is PUT /pools/{template} {"size": N}: 200 with the pool; the size
// is kept in SQLite and restored when the daemon starts again.
func (s *Server) setPool(w http.ResponseWriter, r *http.Request) {
	size, err := parsePoolSize(r) // bodies.go
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	p, err := s.cfg.Pools.SetPool(r.Context(), r.PathValue("template"), size)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, poolBody(p))
}
