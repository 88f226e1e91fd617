package api

import (
	"errors"
	"net/http"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/template"
)

// deleteMachineTemplate removes one of this machine's templates (a
// builtin, an image, a `cella template build`) for the admin key: they
// are every team's. It is refused while a warm pool of this daemon keeps
// sandboxes of it, or while a sandbox of any daemon sharing the cache
// runs or is paused on it (the store's leases).
func (s *Server) deleteMachineTemplate(r *http.Request, name string) error {
	if !isAdmin(r) {
		return errdefs.Forbidden("template %q is this machine's, every team's: only the admin key (<data-dir>/admin.key) may remove it", name)
	}
	if err := s.poolHolding(name); err != nil {
		return err
	}
	err := s.cfg.Templates.Delete(name)
	switch {
	case errors.Is(err, template.ErrInUse):
		return errdefs.Conflict("%v", err)
	case errors.Is(err, template.ErrNotFound):
		return errdefs.NotFound("template %q not found", name)
	}
	return err
}

// poolHolding refuses the removal of a template-store name that a warm
// pool of this daemon keeps sandboxes of.
func (s *Server) poolHolding(name string) error {
	for _, p := range s.cfg.Pools.Pools() {
		if p.Template == name && p.Size > 0 {
			return errdefs.Conflict("template %q has a warm pool of %d sandbox(es): remove the pool first (cella pool set %s --size 0)", name, p.Size, name)
		}
	}
	return nil
}
