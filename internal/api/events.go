package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/events"
	"github.com/cella-sandbox/cella/internal/store"
)

// E2B's lifecycle events API and webhooks (internal/events): the events
// of the caller's team's sandboxes, and the team's webhooks.
func (s *Server) eventRoutes(auth func(http.HandlerFunc) http.Handler) {
	m := s.mux
	m.Handle("GET /events/sandboxes", auth(s.sandboxEvents))
	m.Handle("GET /events/sandboxes/{id}", auth(s.sandboxEvents))
	m.Handle("GET /events/webhooks", auth(s.listWebhooks))
	m.Handle("POST /events/webhooks", auth(s.writeWebhook(http.StatusCreated, func(ev *events.Service, r *http.Request, in events.WebhookInput) (store.Webhook, error) {
		return ev.CreateWebhook(r.Context(), caller(r), in)
	})))
	m.Handle("GET /events/webhooks/{id}", auth(s.getWebhook))
	m.Handle("PATCH /events/webhooks/{id}", auth(s.writeWebhook(http.StatusOK, func(ev *events.Service, r *http.Request, in events.WebhookInput) (store.Webhook, error) {
		return ev.UpdateWebhook(r.Context(), caller(r), r.PathValue("id"), in)
	})))
	m.Handle("DELETE /events/webhooks/{id}", auth(s.deleteWebhook))
}

func (s *Server) eventService(w http.ResponseWriter, r *http.Request) *events.Service {
	if s.cfg.Events == nil {
		s.writeErr(w, r, errdefs.NotImplemented("this daemon keeps no lifecycle events"))
		return nil
	}
	return s.cfg.Events
}

// MaxEventsPage bounds one page of GET /events/sandboxes/{id}.
const MaxEventsPage = 1000

// sandboxEvents is GET /events/sandboxes/{id}?offset&limit&orderAsc: the
// sandbox's stored events, newest first (orderAsc=true: oldest first);
// without an ID, those of every sandbox of the caller's team. Another
// team's sandbox, like an unknown one, has none.
func (s *Server) sandboxEvents(w http.ResponseWriter, r *http.Request) {
	ev := s.eventService(w, r)
	if ev == nil {
		return
	}
	q := r.URL.Query()
	limit, err := intParam(q, "limit", 100, MaxEventsPage)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	offset := 0
	if v := q.Get("offset"); v != "" {
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 {
			s.writeErr(w, r, errdefs.InvalidArgument("offset must be a non-negative integer (got %q)", v))
			return
		}
	}
	asc, err := boolQuery(q, "orderAsc")
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out, err := ev.SandboxEvents(r.Context(), caller(r), r.PathValue("id"), offset, limit, asc)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// webhookBody is E2B's webhook as the API shows it (never the secret).
type webhookBody struct {
	ID        string    `json:"id"`
	TeamID    string    `json:"teamID"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
	Enabled   bool      `json:"enabled"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
}

func webhookOut(h store.Webhook) webhookBody {
	return webhookBody{ID: h.ID, TeamID: h.TeamID, Name: h.Name, CreatedAt: h.CreatedAt, Enabled: h.Enabled, URL: h.URL, Events: h.Events}
}

// webhookInput reads a create or update body.
func webhookInput(r *http.Request) (events.WebhookInput, error) {
	var b struct {
		Name            *string  `json:"name"`
		URL             *string  `json:"url"`
		Events          []string `json:"events"`
		Enabled         *bool    `json:"enabled"`
		SignatureSecret *string  `json:"signatureSecret"`
	}
	if err := decodeBody(r, &b); err != nil {
		return events.WebhookInput{}, err
	}
	return events.WebhookInput{Name: b.Name, URL: b.URL, Events: b.Events, Enabled: b.Enabled, Secret: b.SignatureSecret}, nil
}

// writeWebhook reads a webhook body, hands it to f and answers the
// webhook with status: create and update.
func (s *Server) writeWebhook(status int, f func(ev *events.Service, r *http.Request, in events.WebhookInput) (store.Webhook, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ev := s.eventService(w, r)
		if ev == nil {
			return
		}
		in, err := webhookInput(r)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		h, err := f(ev, r, in)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		writeJSON(w, status, webhookOut(h))
	}
}

func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request) {
	ev := s.eventService(w, r)
	if ev == nil {
		return
	}
	hs, err := ev.Webhooks(r.Context(), caller(r))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := make([]webhookBody, 0, len(hs))
	for _, h := range hs {
		out = append(out, webhookOut(h))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getWebhook(w http.ResponseWriter, r *http.Request) {
	ev := s.eventService(w, r)
	if ev == nil {
		return
	}
	h, err := ev.Webhook(r.Context(), caller(r), r.PathValue("id"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, webhookOut(h))
}

// deleteWebhook answers 200 with the deleted webhook's ID.
func (s *Server) deleteWebhook(w http.ResponseWriter, r *http.Request) {
	ev := s.eventService(w, r)
	if ev == nil {
		return
	}
	id := r.PathValue("id")
	if err := ev.DeleteWebhook(r.Context(), caller(r), id); err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": id})
}
