package api

import (
	"errors"
	"net/http"
	"strings"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/quota"
	"github.com/cella-sandbox/cella/internal/store"
)

// keyLimits are a key's quota as the API shows and takes it (POST /keys,
// PATCH /keys/{id}, GET /keys/self): 0 and "" are unlimited.
type keyLimits struct {
	MaxSandboxes int    `json:"maxSandboxes"`
	MaxVCPUs     int    `json:"maxVcpus"`
	MaxMemoryMB  int64  `json:"maxMemoryMB"`
	CreateRate   string `json:"createRate"`
	RequestRate  string `json:"requestRate"`
}

// keyUsage is what a key holds now, against its limits.
type keyUsage struct {
	Sandboxes int     `json:"sandboxes"`
	VCPUs     float64 `json:"vcpus"`
	MemoryMB  int64   `json:"memoryMB"`
}

func limitsBody(l quota.Limits) keyLimits {
	return keyLimits{MaxSandboxes: l.MaxSandboxes, MaxVCPUs: l.MaxVCPUs, MaxMemoryMB: l.MaxMemoryMB,
		CreateRate: l.CreateRate.String(), RequestRate: l.RequestRate.String()}
}

// limitsRequest is the quota part of a key's create or update body; an
// absent field keeps what the key has (a new key: unlimited).
type limitsRequest struct {
	MaxSandboxes *int    `json:"maxSandboxes"`
	MaxVCPUs     *int    `json:"maxVcpus"`
	MaxMemoryMB  *int64  `json:"maxMemoryMB"`
	CreateRate   *string `json:"createRate"`
	RequestRate  *string `json:"requestRate"`
}

// maxQuotaCount bounds maxSandboxes and maxVcpus; maxQuotaMemoryMB
// maxMemoryMB (1 PiB).
const (
	maxQuotaCount    = 1_000_000
	maxQuotaMemoryMB = 1 << 30
)

// apply checks the fields given and sets them on l.
func (q limitsRequest) apply(l *quota.Limits) error {
	count := func(field string, v *int, dst *int) error {
		if v == nil {
			return nil
		}
		if *v < 0 || *v > maxQuotaCount {
			return errdefs.InvalidArgument("%s must be from 0 (unlimited) to %d (got %d)", field, maxQuotaCount, *v)
		}
		*dst = *v
		return nil
	}
	if err := count("maxSandboxes", q.MaxSandboxes, &l.MaxSandboxes); err != nil {
		return err
	}
	if err := count("maxVcpus", q.MaxVCPUs, &l.MaxVCPUs); err != nil {
		return err
	}
	if v := q.MaxMemoryMB; v != nil {
		if *v < 0 || *v > maxQuotaMemoryMB {
			return errdefs.InvalidArgument("maxMemoryMB must be from 0 (unlimited) to %d (got %d)", int64(maxQuotaMemoryMB), *v)
		}
		l.MaxMemoryMB = *v
	}
	for _, f := range []struct {
		name string
		v    *string
		dst  *quota.Rate
	}{{"createRate", q.CreateRate, &l.CreateRate}, {"requestRate", q.RequestRate, &l.RequestRate}} {
		if f.v == nil {
			continue
		}
		r, err := quota.ParseRate(*f.v)
		if err != nil {
			return errdefs.InvalidArgument("%s: %v", f.name, err)
		}
		*f.dst = r
	}
	return nil
}

func (q limitsRequest) empty() bool {
	return q.MaxSandboxes == nil && q.MaxVCPUs == nil && q.MaxMemoryMB == nil && q.CreateRate == nil && q.RequestRate == nil
}

// updateKey is PATCH /keys/{id} (admin key only): the key's quota fields
// that the body names are replaced; {id} is a key's ID or its name.
func (s *Server) updateKey(w http.ResponseWriter, r *http.Request) {
	var req limitsRequest
	if err := decodeBody(r, &req); err != nil {
		s.writeErr(w, r, err)
		return
	}
	k, err := s.keyByIDOrName(r, r.PathValue("id"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if k.ID == store.AdminKeyID && !req.empty() {
		s.writeErr(w, r, errdefs.InvalidArgument("the admin key is unlimited: its quota cannot be set"))
		return
	}
	l := k.Limits
	if err := req.apply(&l); err != nil {
		s.writeErr(w, r, err)
		return
	}
	k, err = s.cfg.Store.SetKeyLimits(r.Context(), k.ID, l)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.keyBody(k))
}

// keyByIDOrName finds a key by its ID, else by a name only one key has.
func (s *Server) keyByIDOrName(r *http.Request, ref string) (store.APIKey, error) {
	k, err := s.cfg.Store.GetAPIKey(r.Context(), ref)
	if err == nil {
		return k, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return store.APIKey{}, err
	}
	keys, err := s.cfg.Store.ListAPIKeys(r.Context())
	if err != nil {
		return store.APIKey{}, err
	}
	var found []store.APIKey
	for _, k := range keys {
		if k.Name == ref {
			found = append(found, k)
		}
	}
	switch len(found) {
	case 0:
		return store.APIKey{}, errdefs.NotFound("API key %q not found", ref)
	case 1:
		return found[0], nil
	}
	ids := make([]string, len(found))
	for i, k := range found {
		ids[i] = k.ID
	}
	return store.APIKey{}, errdefs.Conflict("%d API keys are named %q (%s): name one by its ID", len(found), ref, strings.Join(ids, ", "))
}

// takeRate takes n tokens of a key's rate (the admin key has none) or
// answers the 429 that names the limit: E2B's shape, Retry-After when
// waiting helps.
func (s *Server) takeRate(k store.APIKey, field, flag string, r quota.Rate, n int) error {
	if k.ID == store.AdminKeyID || r.Unlimited() {
		return nil
	}
	ok, retry := s.buckets.Take(field+"/"+k.ID, r, n)
	if ok {
		return nil
	}
	s.cfg.Metrics.QuotaRejection(field)
	hint := "raise it with `cella key update " + k.Name + " " + flag + " N/" + strings.SplitN(r.String(), "/", 2)[1] + "`"
	if retry == 0 {
		return errdefs.ResourceExhausted("API key %q has a %s of %s (%s): %d at once can never fit; ask for fewer or %s",
			k.Name, strings.TrimPrefix(flag, "--"), r, field, n, hint)
	}
	return errdefs.RateLimited(retry, "API key %q is over its %s of %s (%s): retry in %ds, or %s",
		k.Name, strings.ReplaceAll(strings.TrimPrefix(flag, "--"), "-", " "), r, field, quota.RetryAfter(retry), hint)
}

// takeCreates takes n creates of the caller's create rate.
func (s *Server) takeCreates(r *http.Request, n int) error {
	k := apiKeyFrom(r.Context())
	return s.takeRate(k, "createRate", "--create-rate", k.Limits.CreateRate, n)
}
