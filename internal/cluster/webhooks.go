package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/cella-sandbox/cella/internal/store"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A cluster's webhooks (/events/webhooks) are one Kubernetes Secret,
// cella-webhooks: its data maps each webhook's ID to its record
// (store.Webhook: team, URL, events, the signing secret sealed under the
// cluster's master key). Every node serves the routes from it and reads it
// for each event it delivers, so a webhook registered through any node or
// gateway receives the events of every node's sandboxes, and a change is
// seen by the next event everywhere. Every change is
// resourceVersion-checked.
const (
	WebhooksSecret = "cella-webhooks"
	roleWebhooks   = "webhooks"
)

// WebhookRecords are the cluster's webhooks: events.Webhooks over
// cella-webhooks.
type WebhookRecords struct {
	c  client.Client
	ns string
}

// NewWebhookRecords keeps webhooks in namespace ns.
func NewWebhookRecords(c client.Client, ns string) *WebhookRecords {
	return &WebhookRecords{c: c, ns: ns}
}

// ListWebhooks returns team's webhooks, oldest first ("": every team's).
func (r *WebhookRecords) ListWebhooks(ctx context.Context, team string) ([]store.Webhook, error) {
	s, err := readSecret(ctx, r.c, r.ns, WebhooksSecret)
	if err != nil {
		return nil, err
	}
	out := []store.Webhook{}
	if s == nil {
		return out, nil
	}
	for id, b := range s.Data {
		var w store.Webhook
		if err := json.Unmarshal(b, &w); err != nil {
			return nil, fmt.Errorf("secret %s: webhook %s: %w", WebhooksSecret, id, err)
		}
		if team == "" || w.TeamID == team {
			out = append(out, w)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// GetWebhook returns team's webhook id ("": any team's), or
// store.ErrNotFound.
func (r *WebhookRecords) GetWebhook(ctx context.Context, team, id string) (store.Webhook, error) {
	s, err := readSecret(ctx, r.c, r.ns, WebhooksSecret)
	if err != nil {
		return store.Webhook{}, err
	}
	if s == nil || s.Data[id] == nil {
		return store.Webhook{}, store.ErrNotFound
	}
	var w store.Webhook
	if err := json.Unmarshal(s.Data[id], &w); err != nil {
		return store.Webhook{}, fmt.Errorf("secret %s: webhook %s: %w", WebhooksSecret, id, err)
	}
	if team != "" && w.TeamID != team {
		return store.Webhook{}, store.ErrNotFound
	}
	return w, nil
}

// PutWebhook adds or replaces w.
func (r *WebhookRecords) PutWebhook(ctx context.Context, w store.Webhook) error {
	b, err := json.Marshal(w)
	if err != nil {
		return fmt.Errorf("encode webhook %s: %w", w.ID, err)
	}
	return editSecret(ctx, r.c, r.ns, WebhooksSecret, roleWebhooks, "store webhook "+w.ID, func(data map[string][]byte) error {
		data[w.ID] = b
		return nil
	})
}

// DeleteWebhook removes team's webhook id ("": any team's), or
// store.ErrNotFound.
func (r *WebhookRecords) DeleteWebhook(ctx context.Context, team, id string) error {
	return editSecret(ctx, r.c, r.ns, WebhooksSecret, roleWebhooks, "delete webhook "+id, func(data map[string][]byte) error {
		var w store.Webhook
		if data[id] == nil || json.Unmarshal(data[id], &w) != nil || (team != "" && w.TeamID != team) {
			return store.ErrNotFound
		}
		delete(data, id)
		return nil
	})
}
