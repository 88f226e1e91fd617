package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// VolumeMount is a volumeMounts item of a create request.
type VolumeMount struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// Lifecycle is cella's lifecycle create field; nil fields take the
// daemon's defaults, 0 turns a policy off.
type Lifecycle struct {
	AutoStopSeconds    *float64 `json:"autoStopSeconds,omitempty"`
	AutoArchiveSeconds *float64 `json:"autoArchiveSeconds,omitempty"`
	AutoDeleteSeconds  *float64 `json:"autoDeleteSeconds,omitempty"`
	OnTimeout          string   `json:"onTimeout,omitempty"`
	AutoResume         *bool    `json:"autoResume,omitempty"`
}

// Seconds is a helper for Lifecycle's fields.
func Seconds(d time.Duration) *float64 {
	s := d.Seconds()
	return &s
}

// Volume is a volume as the daemon shows it.
type Volume struct {
	VolumeID  string    `json:"volumeID"`
	Name      string    `json:"name"`
	SizeMB    int64     `json:"sizeMB"`
	UsedBytes int64     `json:"usedBytes"`
	Mounted   bool      `json:"mounted"`
	CreatedAt time.Time `json:"createdAt"`
	UsedBy    []string  `json:"usedBy"`
}

// CreateVolume makes a volume of sizeMB MiB (0: the daemon's default).
func (c *Client) CreateVolume(ctx context.Context, name string, sizeMB int64) (Volume, error) {
	req := map[string]any{"name": name}
	if sizeMB > 0 {
		req["sizeMB"] = sizeMB
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
