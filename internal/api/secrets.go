package api

import (
	"encoding/base64"
	"net/http"
	"sort"

	"github.com/cella-sandbox/cella/internal/apiwire"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/secrets"
)

// Secrets speak E2B's /secrets API (e2b SDK >= 2.51, class Secret):
//
//	POST   /secrets              {name, value, metadata?} → 201 Secret; 409 if the name exists
//	POST   /secrets/{secretID}   {value, metadata?}       → 200 Secret, currentVersion + 1
//	GET    /secrets/{secretID}                            → 200 Secret
//	GET    /secrets?limit&nextToken                       → 200 [Secret], X-Next-Token when more remain
//	DELETE /secrets/{secretID}                            → 204
//
// where {secretID} is a secret's ID or its name, and Secret is
// {secretID, name, currentVersion, metadata, createdAt, updatedAt}.
//
// Secrets are operator-level: an ordinary key drives sandboxes, and a
// sandbox's user must not be able to replace the token its egress rules
// inject. So every route is for the admin key only, and no answer carries a
// value: they go into traffic through the egress proxy, never back out.
func (s *Server) secretRoutes(auth func(http.HandlerFunc) http.Handler) {
	m := s.mux
	m.Handle("POST /secrets", auth(s.secretsAdmin(s.createSecret)))
	m.Handle("GET /secrets", auth(s.secretsAdmin(s.listSecrets)))
	m.Handle("GET /secrets/{secretID}", auth(s.secretsAdmin(s.getSecret)))
	m.Handle("POST /secrets/{secretID}", auth(s.secretsAdmin(s.updateSecret)))
	m.Handle("DELETE /secrets/{secretID}", auth(s.secretsAdmin(s.deleteSecret)))
}

// secretBody is E2B's Secret schema. Metadata is always an object, {} when
// unset, as E2B documents it.
func secretBody(i secrets.Info) apiwire.Secret {
	md := i.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return apiwire.Secret{
		SecretID: i.ID, Name: i.Name, CurrentVersion: i.Version, Metadata: md,
		CreatedAt: i.CreatedAt.UTC(), UpdatedAt: i.UpdatedAt.UTC(),
	}
}

// secretsAdmin admits the admin key only, then needs a configured manager.
func (s *Server) secretsAdmin(h func(http.ResponseWriter, *http.Request, Secrets)) http.HandlerFunc {
	return s.adminOnly("manage secrets", func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Secrets == nil {
			s.writeErr(w, r, errdefs.NotImplemented("secrets are not configured on this daemon"))
			return
		}
		h(w, r, s.cfg.Secrets)
	})
}

// createSecret is POST /secrets. It never replaces: E2B keeps create and
// update apart, and a create that silently overwrote would let a typo or a
// second script clobber a credential others rely on.
func (s *Server) createSecret(w http.ResponseWriter, r *http.Request, sm Secrets) {
	var req apiwire.NewSecret
	if err := decodeBody(r, &req); err != nil {
		s.writeErr(w, r, err)
		return
	}
	info, err := sm.Create(r.Context(), req.Name, req.Value, req.Metadata)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, secretBody(info))
}

// updateSecret is POST /secrets/{secretID}: a new value, the next version.
// Metadata, when sent, replaces the stored metadata ({} clears it); when
// left out it is kept, as the SDK's update without opts.metadata expects.
func (s *Server) updateSecret(w http.ResponseWriter, r *http.Request, sm Secrets) {
	var req apiwire.SecretUpdate // Metadata: nil when left out
	if err := decodeBody(r, &req); err != nil {
		s.writeErr(w, r, err)
		return
	}
	var md map[string]string
	if req.Metadata != nil {
		md = *req.Metadata
	}
	info, err := sm.Update(r.Context(), r.PathValue("secretID"), req.Value, md)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, secretBody(info))
}

// maxSecretPage is the largest and default page, as for GET /v2/sandboxes.
const maxSecretPage = 100

// listSecrets is GET /secrets?limit=&nextToken=, by name. The token is the
// last name of the page (base64url), so a page boundary stays put while
// secrets are added or removed around it.
func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request, sm Secrets) {
	limit, after, err := parseSecretPage(r.URL.Query()) // bodies.go
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	all := sm.List()
	start := 0
	if after != "" {
		start = sort.Search(len(all), func(i int) bool { return all[i].Name > after })
	}
	page := all[start:]
	if len(page) > limit {
		page = page[:limit]
		w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(page[len(page)-1].Name)))
	}
	out := make([]apiwire.Secret, 0, len(page))
	for _, i := range page {
		out = append(out, secretBody(i))
	}
	writeJSON(w, http.StatusOK, out)
}

// getSecret is GET /secrets/{secretID}, by ID or name.
func (s *Server) getSecret(w http.ResponseWriter, r *http.Request, sm Secrets) {
	info, err := sm.Info(r.PathValue("secretID"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, secretBody(info))
}

// deleteSecret is DELETE /secrets/{secretID}, by ID or name; a missing
// secret is 404, which the SDK's Secret.destroy turns into false.
func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request, sm Secrets) {
	if err := sm.Delete(r.Context(), r.PathValue("secretID")); err != nil {
		s.writeErr(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
