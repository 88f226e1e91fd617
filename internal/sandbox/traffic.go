package sandbox

import (
	"context"
	"strconv"
	"strings"

	"github.com/cella-sandbox/cella/internal/edge"
	"github.com/cella-sandbox/cella/internal/envd/process/processconnect"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// Route is how sandbox traffic (internal/edge) finds its sandbox: as
// tenant.Traffic, which finds any sandbox by ID, and hands it to admit,
// which checks the request's credential against it, before anything else
// happens: nothing is resumed or reached without the sandbox's own
// credential. Then a sandbox paused with autoResume is resumed (E2B's
// connect, with the default TTL); one paused without is an
// *edge.PausedError, as is a failed resume; an unknown sandbox, or one that
// is not running, is NotFound.
func (m *Manager) Route(ctx context.Context, id string, admit func(*Sandbox) error) (*Sandbox, error) {
	sb, err := m.Lookup(tenant.Traffic, id)
	if err != nil {
		return nil, err
	}
	if err := admit(sb); err != nil {
		return nil, err
	}
	if sb.State() == StatePaused {
		if !sb.Options.AutoResume {
			return nil, &edge.PausedError{}
		}
		if _, _, err := m.Connect(ctx, tenant.Traffic, id, DefaultTimeout, true); err != nil {
			m.log.Warn("auto-resume failed", "id", id, "err", err)
			return nil, &edge.PausedError{Resume: err}
		}
	}
	if sb.State() != StateRunning {
		return nil, notFound(id)
	}
	return sb, nil
}

// TrafficRouter is the manager as the sandbox traffic proxy's router.
func (m *Manager) TrafficRouter() edge.Router { return trafficRouter{m} }

type trafficRouter struct{ m *Manager }

func (r trafficRouter) Route(ctx context.Context, id string, admit func(edge.Sandbox) error) (edge.Sandbox, error) {
	sb, err := r.m.Route(ctx, id, func(sb *Sandbox) error { return admit(sb.Traffic()) })
	if err != nil {
		return nil, err
	}
	return sb.Traffic(), nil
}

// Signed finds the sandbox a signed file URL was made for, of any owner: the
// signature, made with the sandbox's envd access token, is the credential.
func (r trafficRouter) Signed(signs func(string) bool) (string, bool) {
	for _, sb := range r.m.List(tenant.Traffic) {
		if sb.EnvdAccessToken != "" && signs(sb.EnvdAccessToken) {
			return sb.ID, true
		}
	}
	return "", false
}

// Traffic is the sandbox as the traffic proxy and its shells see it.
func (s *Sandbox) Traffic() edge.Sandbox { return traffic{s} }

type traffic struct{ sb *Sandbox }

func (t traffic) ID() string                 { return t.sb.ID }
func (t traffic) EnvdAccessToken() string    { return t.sb.EnvdAccessToken }
func (t traffic) TrafficAccessToken() string { return t.sb.Options.TrafficAccessToken }
func (t traffic) EnvdTokenOptional() bool    { return t.sb.Options.Insecure }
func (t traffic) RequestHost(port int) string {
	return strings.ReplaceAll(t.sb.Options.MaskRequestHost, MaskPortPlaceholder, strconv.Itoa(port))
}
func (t traffic) BeginActivity() (end func()) { return t.sb.BeginActivity() }

func (t traffic) Process(user string) processconnect.ProcessClient {
	return t.sb.Agent().Process(user)
}

func (t traffic) Link(ctx context.Context) (edge.Link, error) {
	l, err := t.sb.Agent().Link(ctx)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Ended: a running or paused sandbox may serve again; any other will not.
func (t traffic) Ended() (string, bool) {
	if st := t.sb.State(); st != StateRunning && st != StatePaused {
		return "the sandbox is " + st, true
	}
	return "", false
}
