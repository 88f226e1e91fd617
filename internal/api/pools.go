package api

import (
	"net/http"

	"github.com/cella-sandbox/cella/internal/apiwire"
	"github.com/cella-sandbox/cella/internal/sandbox"
)

// Warm pools (sandbox/pool.go): GET /pools for any key, PUT
// /pools/{template} {"size": N} for the admin key (0 removes the pool).
func (s *Server) poolRoutes(auth func(http.HandlerFunc) http.Handler) {
	s.mux.Handle("GET /pools", auth(s.listPools))
	s.mux.Handle("PUT /pools/{template}", auth(s.adminOnly("size warm pools", s.setPool)))
}

func poolBody(p sandbox.PoolStatus) apiwire.Pool {
	return apiwire.Pool{Template: p.Template, Size: p.Size, Ready: p.Ready, Filling: p.Filling,
		HandedOut: p.HandedOut, Misses: p.Misses, LastError: p.LastError}
}

func (s *Server) listPools(w http.ResponseWriter, r *http.Request) {
	out := []apiwire.Pool{}
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
