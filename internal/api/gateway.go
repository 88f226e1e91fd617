package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/gatewayauth"
	"github.com/cella-sandbox/cella/internal/store"
)

// asserted is the key a cluster gateway's assertion names (ok false when r
// carries none). The gateway authenticated the client's key; the node
// trusts only an assertion whose MAC verifies under the cluster's gateway
// key, so a client talking to a node directly cannot claim a key by
// header. A daemon that is no cluster node refuses every assertion.
func (s *Server) asserted(r *http.Request) (store.APIKey, bool, error) {
	if !gatewayauth.Present(r) {
		return store.APIKey{}, false, nil
	}
	if len(s.cfg.GatewayKey) == 0 {
		return store.APIKey{}, true, errdefs.Unauthenticated("a gateway assertion, but this daemon is not a cluster node: send an API key")
	}
	id, err := gatewayauth.Verify(s.cfg.GatewayKey, r, time.Now())
	if err != nil {
		return store.APIKey{}, true, errdefs.Unauthenticated("%v", err)
	}
	k, err := s.cfg.Store.GetAPIKey(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return store.APIKey{}, true, errdefs.Unauthenticated("invalid API key")
	}
	if err != nil {
		return store.APIKey{}, true, err
	}
	return k, true, nil
}
