package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/cella-sandbox/cella/internal/apiwire"
)

// VolumeMount is a volumeMounts item of a create request.
type VolumeMount = apiwire.SandboxVolumeMount

// Lifecycle is cella's lifecycle create field; nil fields take the
// daemon's defaults, 0 turns a policy off.
type Lifecycle = apiwire.LifecycleRequest

// OnTimeout is Lifecycle's onTimeout: "kill" or "pause".
type OnTimeout = apiwire.SandboxOnTimeout

// Seconds is a helper for Lifecycle's fields.
func Seconds(d time.Duration) *float64 {
	s := d.Seconds()
	return &s
}

// Volume is a volume as the daemon shows it.
type Volume = apiwire.Volume

// CreateVolume makes a volume of sizeMB MiB (0: the daemon's default).
func (c *Client) CreateVolume(ctx context.Context, name string, sizeMB int64) (Volume, error) {
	req := apiwire.NewVolume{Name: name}
	if sizeMB > 0 {
		req.SizeMB = &sizeMB
	}
	var v Volume
	_, err := c.do(ctx, http.MethodPost, "/volumes", req, &v)
	return v, err
}

// ListVolumes returns every volume.
func (c *Client) ListVolumes(ctx context.Context) ([]Volume, error) {
	var vs []Volume
	_, err := c.do(ctx, http.MethodGet, "/volumes", nil, &vs)
	return vs, err
}

// GetVolume returns one volume.
func (c *Client) GetVolume(ctx context.Context, name string) (Volume, error) {
	var v Volume
	_, err := c.do(ctx, http.MethodGet, "/volumes/"+url.PathEscape(name), nil, &v)
	return v, err
}

// DeleteVolume removes a volume and its data (409 while a sandbox uses it).
func (c *Client) DeleteVolume(ctx context.Context, name string) error {
	_, err := c.do(ctx, http.MethodDelete, "/volumes/"+url.PathEscape(name), nil, nil)
	return err
}
