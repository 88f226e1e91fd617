package api_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// TestVolumesAPI: /volumes CRUD, validation (400), in-use deletion (409), and
// a volume's data and mounts surviving a daemon restart (a paused sandbox
// keeps its mount; a new sandbox sees the data).
func TestVolumesAPI(t *testing.T) {
	dir, err := os.MkdirTemp("", "cella-test-volumes-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{DataDir: dir})
	a := apiT{env: env}
	key := env.APIKey
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	t.Run("BadInput", func(t *testing.T) {
		for _, body := range []any{
			map[string]any{"name": ""},
			map[string]any{"name": "../etc"},
			map[string]any{"name": "a/b"},
			map[string]any{"name": "-x"},
			map[string]any{"name": strings.Repeat("a", 64)},
			map[string]any{"name": "ok", "sizeMB": 1},
			map[string]any{"name": "ok", "size": "lots"},
			map[string]any{"name": "ok", "size": "1G", "sizeMB": 5},
		} {
			st, _, b := a.do(t, "POST", "/volumes", key, body, nil)
			a.wantError(t, 400, st, b, "")
		}
		st, _, b := a.do(t, "GET", "/volumes/nope", key, nil, nil)
		a.wantError(t, 404, st, b, "nope")
		st, _, b = a.do(t, "DELETE", "/volumes/nope", key, nil, nil)
		a.wantError(t, 404, st, b, "nope")
		st, _, b = a.do(t, "GET", "/volumes", "", nil, nil)
		a.wantError(t, 401, st, b, "")
	})

	st, _, body := a.do(t, "POST", "/volumes", key, map[string]any{"name": "data", "size": "64M"}, nil)
	if st != 201 {
		t.Fatalf("create volume: %d %s", st, body)
	}
	var v client.Volume
	json.Unmarshal(body, &v)
	if v.Name != "data" || v.SizeMB != 64 || !v.Mounted {
		t.Fatalf("created volume: %s", body)
	}
	st, _, body = a.do(t, "POST", "/volumes", key, map[string]any{"name": "data"}, nil)
	a.wantError(t, 409, st, body, "exists")

	t.Run("BadMounts", func(t *testing.T) {
		for _, vm := range []map[string]any{
			{"name": "data", "path": "relative"},
			{"name": "data", "path": "/"},
			{"name": "data", "path": "/proc/x"},
			{"name": "data", "path": "/sys"},
			{"name": "data", "path": "/dev/shm"},
			{"name": "data", "path": "/run/cella"},
			{"name": "data", "path": "/.cella/x"},
			{"name": "data", "path": "/mnt/../etc"},
			{"name": "bad/name", "path": "/mnt/x"},
			{"name": "missing", "path": "/mnt/x"},
		} {
			st, _, b := a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "base", "volumeMounts": []any{vm}}, nil)
			a.wantError(t, 400, st, b, "")
		}
		st, _, b := a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "base",
			"volumeMounts": []any{map[string]any{"name": "data", "path": "/a"}, map[string]any{"name": "data", "path": "/a"}}}, nil)
		a.wantError(t, 400, st, b, "twice")
		st, _, b = a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "base", "lifecycle": map[string]any{"autoStopSeconds": -1}}, nil)
		a.wantError(t, 400, st, b, "autoStop")
		st, _, b = a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "base", "lifecycle": map[string]any{"autoStop": "soon"}}, nil)
		a.wantError(t, 400, st, b, "autoStop")
		st, _, b = a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "base", "lifecycle": map[string]any{"autoStopSeconds": 5, "autoStopMinutes": 1}}, nil)
		a.wantError(t, 400, st, b, "more than once")
		if dirs := sandboxDirs(t, env); len(dirs) != 0 {
			t.Fatalf("bad creates left sandbox dirs: %v", dirs)
		}
	})

	// A sandbox with the volume, plus lifecycle fields in the detail.
	st, _, body = a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "base",
		"volumeMounts": []any{map[string]any{"name": "data", "path": "/mnt/data"}},
		"lifecycle":    map[string]any{"autoStopMinutes": 30, "autoArchiveDays": 1.5, "autoDelete": "720h"}}, nil)
	if st != 201 {
		t.Fatalf("create with a volume: %d %s", st, body)
	}
	var created client.Sandbox
	json.Unmarshal(body, &created)
	id := created.SandboxID
	defer env.Client.Kill(context.Background(), id)
	_, _, body = a.do(t, "GET", "/sandboxes/"+id, key, nil, nil)
	var d struct {
		VolumeMounts []map[string]any `json:"volumeMounts"`
		Lifecycle    map[string]any   `json:"lifecycle"`
		Next         *struct {
			Action string    `json:"action"`
			At     time.Time `json:"at"`
		} `json:"nextTransition"`
	}
	json.Unmarshal(body, &d)
	if len(d.VolumeMounts) != 1 || d.VolumeMounts[0]["name"] != "data" || d.VolumeMounts[0]["path"] != "/mnt/data" ||
		d.Lifecycle["autoStopSeconds"] != 1800.0 || d.Lifecycle["autoArchiveSeconds"] != 129600.0 || d.Lifecycle["autoDeleteSeconds"] != 2592000.0 {
		t.Fatalf("detail: %s", body)
	}
	// The TTL (300 s) comes before the 30 min idle stop.
	if d.Next == nil || d.Next.Action != "kill" || time.Until(d.Next.At) > 301*time.Second {
		t.Fatalf("nextTransition: %s", body)
	}
	sb, err := env.Client.Sandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Exec(ctx, "echo persisted > /mnt/data/f", client.ExecOptions{}); err != nil || res.ExitCode != 0 {
		t.Fatalf("write to volume: %+v %v", res, err)
	}
	_, _, body = a.do(t, "GET", "/volumes/data", key, nil, nil)
	json.Unmarshal(body, &v)
	if len(v.UsedBy) != 1 || v.UsedBy[0] != id {
		t.Fatalf("volume usedBy: %s", body)
	}
	st, _, body = a.do(t, "DELETE", "/volumes/data", key, nil, nil)
	a.wantError(t, 409, st, body, id)

	// Paused, it still holds the volume; through a restart too.
	if err := env.Client.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	st, _, body = a.do(t, "DELETE", "/volumes/data", key, nil, nil)
	a.wantError(t, 409, st, body, "in use")
	env.Close()

	env2 := daemontest.Start(t, runtime.GVisor, daemontest.Options{DataDir: dir})
	a2 := apiT{env: env2}
	_, _, body = a2.do(t, "GET", "/volumes", env2.APIKey, nil, nil)
	var vs []client.Volume
	json.Unmarshal(body, &vs)
	if len(vs) != 1 || vs[0].Name != "data" || !vs[0].Mounted || vs[0].UsedBytes == 0 {
		t.Fatalf("volumes after restart: %s", body)
	}
	if _, resumed, err := env2.Client.ConnectResumed(ctx, id); err != nil || !resumed {
		t.Fatalf("resume after restart: %v %v", resumed, err)
	}
	sb, err = env2.Client.Sandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Exec(ctx, "cat /mnt/data/f && echo more >> /mnt/data/f", client.ExecOptions{}); err != nil || res.Stdout != "persisted\n" {
		t.Fatalf("volume in the resumed sandbox: %+v %v", res, err)
	}
	if err := env2.Client.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	other, err := env2.Client.Create(ctx, client.CreateRequest{VolumeMounts: []client.VolumeMount{{Name: "data", Path: "/srv/d", ReadOnly: true}}})
	if err != nil {
		t.Fatal(err)
	}
	osb, err := env2.Client.Sandbox(ctx, other.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := osb.Exec(ctx, "cat /srv/d/f", client.ExecOptions{}); err != nil || res.Stdout != "persisted\nmore\n" {
		t.Fatalf("a new sandbox after restart: %+v %v", res, err)
	}
	if err := env2.Client.Kill(ctx, other.SandboxID); err != nil {
		t.Fatal(err)
	}
	if st, _, body := a2.do(t, "DELETE", "/volumes/data", env2.APIKey, nil, nil); st != 204 {
		t.Fatalf("delete: %d %s", st, body)
	}
	if _, err := os.Stat(filepath.Join(dir, "volumes", "data")); !os.IsNotExist(err) {
		t.Fatalf("volume dir after delete: %v", err)
	}
}
