package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/sandbox"
)

// TestRequestBounds sends every route that turns a number into a limit, a
// duration, a time or a size the numbers an attacker would: above the
// operator's maxima (10 TB of memory, a 96 TB RAM disk, 4 million
// processes), so large that they wrap around as a time.Duration
// (18446744074 s is 0.29 s), negative, beyond a float's range. Each is a 400
// naming the field and what is allowed; nothing is created, and the sandbox
// the per-sandbox routes are tried on keeps the lifetime it was given.
func TestRequestBounds(t *testing.T) {
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{
		Maxima: sandbox.Maxima{CPUs: 2, MemoryMB: 2048, DiskMB: 2048, Pids: 1024},
	})
	a := apiT{env: env}
	key := env.APIKey
	type attack struct{ method, path, body, want string }
	try := func(t *testing.T, attacks []attack) {
		t.Helper()
		for _, c := range attacks {
			var body any
			if c.body != "" {
				body = c.body
			}
			st, _, resp := a.do(t, c.method, c.path, key, body, nil)
			var e struct {
				Code    int
				Message string
			}
			json.Unmarshal(resp, &e)
			if st != http.StatusBadRequest || e.Code != st || !strings.Contains(e.Message, c.want) {
				t.Errorf("%s %s %s: %d %s; want 400 saying %q", c.method, c.path, c.body, st, resp, c.want)
			}
		}
	}

	t.Run("Create", func(t *testing.T) {
		var attacks []attack
		for _, path := range []string{"/v2/sandboxes", "/sandboxes"} {
			for body, want := range map[string]string{
				`{"memoryMB": 10485760}`:                     "memory 10485760 MiB is above this daemon's maximum of 2048 MiB (cella serve --max-memory)",
				`{"diskSizeMB": 100663296}`:                  "disk 100663296 MiB is above this daemon's maximum of 2048 MiB (cella serve --max-disk)",
				`{"pidsLimit": 4194304}`:                     "pids 4194304 is above this daemon's maximum of 1024 (cella serve --max-pids)",
				`{"cpuCount": 1000}`:                         "cpus 1000 is above this daemon's maximum of 2 (cella serve --max-cpus)",
				`{"cpuCount": 1e308}`:                        "above this daemon's maximum of 2 (cella serve --max-cpus)",
				`{"outputLimitMB": 1125899906842624}`:        "output limit 1125899906842624 MiB is above the maximum of 1024 MiB",
				`{"timeout": 18446744074}`:                   "timeout must be between 0 and 86400 seconds",
				`{"timeout": 9223372036854775807}`:           "timeout must be between 0 and 86400 seconds",
				`{"timeout": 86401}`:                         "timeout must be between 0 and 86400 seconds",
				`{"lifecycle": {"autoStopMinutes": 1e300}}`:  "lifecycle.autoStopMinutes must be between 0 and 5256000 minutes",
				`{"lifecycle": {"autoArchiveDays": 5e9}}`:    "lifecycle.autoArchiveDays must be between 0 and 3650 days",
				`{"lifecycle": {"autoDeleteSeconds": -1}}`:   "lifecycle.autoDeleteSeconds must be between 0 and",
				`{"lifecycle": {"autoStop": "9999999999h"}}`: "lifecycle.autoStop",
			} {
				attacks = append(attacks, attack{"POST", path, body, want})
			}
		}
		try(t, attacks)
		if d := sandboxDirs(t, env); len(d) != 0 {
			t.Fatalf("refused creates left sandbox dirs behind: %v", d)
		}
	})

	// At the maxima a create succeeds, with exactly what it asked for.
	st, _, body := a.do(t, "POST", "/v2/sandboxes", key, `{"cpuCount": 2, "memoryMB": 2048, "diskSizeMB": 2048, "pidsLimit": 1024, "outputLimitMB": 1024, "timeout": 86400}`, nil)
	if st != http.StatusCreated {
		t.Fatalf("create at the maxima: %d %s", st, body)
	}
	var sb struct{ SandboxID string }
	json.Unmarshal(body, &sb)
	t.Cleanup(func() { env.Client.Kill(t.Context(), sb.SandboxID) })
	detail := func(t *testing.T) (d struct {
		CPUCount      float64
		MemoryMB      int64
		DiskSizeMB    int64
		PidsLimit     int64
		OutputLimitMB int64
		State         string
		StartedAt     time.Time
		EndAt         time.Time
	}) {
		t.Helper()
		st, _, body := a.do(t, "GET", "/sandboxes/"+sb.SandboxID, key, nil, nil)
		if st != http.StatusOK {
			t.Fatalf("GET the sandbox: %d %s", st, body)
		}
		json.Unmarshal(body, &d)
		return d
	}
	if d := detail(t); d.CPUCount != 2 || d.MemoryMB != 2048 || d.DiskSizeMB != 2048 || d.PidsLimit != 1024 || d.OutputLimitMB != 1024 || d.EndAt.Sub(d.StartedAt) != 24*time.Hour {
		t.Fatalf("sandbox at the maxima: %+v", d)
	}

	t.Run("SandboxRoutes", func(t *testing.T) {
		p := "/sandboxes/" + sb.SandboxID
		try(t, []attack{
			{"POST", p + "/timeout", `{"timeout": 18446744074}`, "timeout must be between 0 and 86400 seconds"},
			{"POST", p + "/timeout", `{"timeout": -1}`, "timeout must be between 0 and 86400 seconds"},
			{"POST", p + "/refreshes", `{"duration": 9223372037}`, "duration must be between 0 and 86400 seconds"},
			{"POST", p + "/refreshes", `{"duration": -60}`, "duration must be between 0 and 86400 seconds"},
			{"POST", p + "/connect", `{"timeout": 9223372037}`, "timeout must be between 0 and 86400 seconds"},
			{"POST", "/v2" + p + "/connect", `{"timeout": 18446744074}`, "timeout must be between 0 and 86400 seconds"},
			{"POST", p + "/resume", `{"timeout": 18446744074}`, "timeout must be between 0 and 86400 seconds"},
			{"POST", p + "/fork", `{"timeout": 18446744074}`, "timeout must be between 0 and 86400 seconds"},
			{"POST", p + "/fork", `{"count": 1000}`, "count must be between 1 and 32"},
			{"POST", p + "/fork", `{"count": 1e30}`, `field "count"`},
			{"POST", p + "/wait", `{"port": 8080, "timeout": 1e300}`, "timeout must be between 0 and 3600 seconds (1h0m0s) (got 1e+300)"},
			{"POST", p + "/wait", `{"port": 8080, "timeout": 9300000000}`, "timeout must be between 0 and 3600 seconds"},
			{"POST", p + "/wait", `{"port": 8080, "timeout": -1}`, "timeout must be between 0 and 3600 seconds"},
			{"POST", p + "/wait", `{"port": 8080, "timeout": 0}`, "timeout must be positive"},
			{"POST", p + "/wait", `{"port": 8080, "timeout": "9999999999h"}`, "timeout must be a duration up to 1h0m0s"},
			{"POST", p + "/wait", `{"port": 8080, "timeout": "2h"}`, "timeout must be a duration up to 1h0m0s"},
			{"GET", p + "/metrics?start=9223372036854775807", "", "start must be a unix time in seconds from 0 to 253402300799"},
			{"GET", p + "/metrics?end=253402300800", "", "end must be a unix time in seconds from 0 to 253402300799"},
			{"GET", p + "/metrics?start=-1", "", "start must be a unix time in seconds"},
			{"GET", p + "/pty?cols=65535", "", "cols must be a number from 1 to 4096"},
			{"GET", p + "/pty?rows=4294967296", "", "rows must be a number from 1 to 4096"},
			{"GET", p + "/pty?cols=0", "", "cols must be a number from 1 to 4096"},
		})
		// None of it shortened (or wrapped) the sandbox's 24 h.
		if d := detail(t); d.State != "running" || d.EndAt.Sub(d.StartedAt) != 24*time.Hour {
			t.Fatalf("after the refused requests the sandbox is %s, ending %v after its start", d.State, d.EndAt.Sub(d.StartedAt))
		}
		// In range, the same routes work.
		if st, _, body := a.do(t, "GET", p+"/metrics?start=0&end=253402300799", key, nil, nil); st != http.StatusOK {
			t.Fatalf("metrics over the whole range: %d %s", st, body)
		}
		if st, _, body := a.do(t, "POST", p+"/refreshes", key, `{"duration": 86400}`, nil); st != http.StatusNoContent {
			t.Fatalf("refresh by the maximum: %d %s", st, body)
		}
	})

	t.Run("PoolsAndVolumes", func(t *testing.T) {
		try(t, []attack{
			{"PUT", "/pools/base", `{"size": 1e30}`, `field "size"`},
			{"PUT", "/pools/base", `{"size": 100000}`, "pool size must be between 0 and"},
			{"PUT", "/pools/base", `{"size": -1}`, "pool size must be between 0 and"},
			{"POST", "/volumes", `{"name": "big", "sizeMB": 1125899906842624}`, "sizeMB must be between"},
			{"POST", "/volumes", `{"name": "big", "size": "99999999999T"}`, "invalid size"},
			{"POST", "/volumes", `{"name": "big", "size": "2T"}`, "outside"},
		})
	})
}
