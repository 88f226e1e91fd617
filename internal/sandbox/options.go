package sandbox

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	goruntime "runtime"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// Defaults of a sandbox's limits, as documented in the README.
const (
	DefaultTimeout  = 300 * time.Second
	MaxTimeout      = 24 * time.Hour
	DefaultCPUs     = 1.0
	DefaultMemoryMB = 512
	DefaultDiskMB   = 1024
	DefaultPids     = 256
	DefaultOutputMB = 10
	DefaultTemplate = "base"

	// MaxOutputMB bounds the per-command output cap (outputLimitMB).
	MaxOutputMB = 1024
	// DefaultMaxPids is the default of --max-pids (the kernel's default
	// pid_max).
	DefaultMaxPids = 32768
)

// Bounds on the maxima themselves: what limits can be turned into host
// ceilings without overflowing (the memory ceiling is limit×1.25 plus
// headroom, in bytes; the pids ceiling 4×limit), far above any machine.
const (
	hardMaxCPUs = 4096
	hardMaxMiB  = 1 << 30 // 1 PiB
	hardMaxPids = 1 << 22 // PID_MAX_LIMIT
)

// Maxima are the operator's upper bounds on a sandbox's resources (cella
// serve --max-cpus, --max-memory, --max-disk, --max-pids): every create,
// fork, snapshot restore and warm pool is normalized against them, and a
// request above one is refused with a message that names it and its flag.
type Maxima struct {
	CPUs     float64
	MemoryMB int64
	DiskMB   int64
	Pids     int64
}

// HostMaxima are the maxima a daemon on dataDir has unless told otherwise:
// the host's cores; its RAM for memory; for disk the smaller of its RAM and
// the data dir's free space (the writable layer is a sparse image in the
// data dir); DefaultMaxPids processes.
func HostMaxima(dataDir string) Maxima {
	m := Maxima{CPUs: float64(goruntime.NumCPU()), Pids: DefaultMaxPids}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err == nil {
		ram := int64(si.Totalram) * int64(si.Unit) >> 20
		m.MemoryMB, m.DiskMB = ram, ram
	}
	var st unix.Statfs_t
	if dataDir != "" && unix.Statfs(dataDir, &st) == nil {
		if free := int64(st.Bavail) * st.Bsize >> 20; free < m.DiskMB {
			m.DiskMB = free
		}
	}
	return m
}

// Resolve fills the maxima left zero with HostMaxima(dataDir) and checks
// that each admits the default of its limit: a create that asks for
// nothing must succeed, and so must a warm pool's sandboxes, which have
// the defaults.
func (m Maxima) Resolve(dataDir string) (Maxima, error) {
	host := HostMaxima(dataDir)
	if m.CPUs == 0 {
		m.CPUs = host.CPUs
	}
	if m.MemoryMB == 0 {
		m.MemoryMB = host.MemoryMB
	}
	if m.DiskMB == 0 {
		m.DiskMB = host.DiskMB
	}
	if m.Pids == 0 {
		m.Pids = host.Pids
	}
	switch {
	case m.CPUs > hardMaxCPUs:
		return m, fmt.Errorf("--max-cpus %g is above the most cella can enforce, %d", m.CPUs, hardMaxCPUs)
	case m.MemoryMB > hardMaxMiB:
		return m, fmt.Errorf("--max-memory %d MiB is above the most cella can enforce, %d MiB", m.MemoryMB, hardMaxMiB)
	case m.DiskMB > hardMaxMiB:
		return m, fmt.Errorf("--max-disk %d MiB is above the most cella can enforce, %d MiB", m.DiskMB, hardMaxMiB)
	case m.Pids > hardMaxPids:
		return m, fmt.Errorf("--max-pids %d is above the most cella can enforce, %d (the kernel's PID_MAX_LIMIT)", m.Pids, hardMaxPids)
	case math.IsNaN(m.CPUs) || m.CPUs < DefaultCPUs:
		return m, fmt.Errorf("--max-cpus %g is below the default sandbox CPUs of %g", m.CPUs, DefaultCPUs)
	case m.MemoryMB < DefaultMemoryMB:
		return m, fmt.Errorf("--max-memory %d MiB is below the default sandbox memory of %d MiB", m.MemoryMB, DefaultMemoryMB)
	case m.DiskMB < DefaultDiskMB:
		return m, fmt.Errorf("--max-disk %d MiB is below the default sandbox disk of %d MiB", m.DiskMB, DefaultDiskMB)
	case m.Pids < DefaultPids:
		return m, fmt.Errorf("--max-pids %d is below the default sandbox pids limit of %d", m.Pids, DefaultPids)
	}
	return m, nil
}

// Options is a normalized create request. Fields cella does not act on yet
// (network policy, volumes) are kept as sent so that the record
// shows what was asked for beside what is in effect.
type Options struct {
	TemplateID string            `json:"template_id"`
	Timeout    time.Duration     `json:"timeout"`
	CPUs       float64           `json:"cpus"`
	MemoryMB   int64             `json:"memory_mb"`
	DiskMB     int64             `json:"disk_mb"`
	Pids       int64             `json:"pids"`
	OutputMB   int64             `json:"output_mb"` // per-command output cap
	Metadata   map[string]string `json:"metadata,omitempty"`
	EnvVars    map[string]string `json:"env_vars,omitempty"`

	AllowInternetAccess *bool           `json:"allow_internet_access,omitempty"`
	Network             json.RawMessage `json:"network,omitempty"`
	// Egress is the policy in force: the request narrowed by the operator's
	// ceiling (api), replaced by PUT /sandboxes/{id}/network. nil is no
	// egress at all.
	Egress *egress.Policy `json:"egress,omitempty"`
	// SecretEnv names secrets to put in the environment (env var → secret
	// name): the weaker option, asked for explicitly. Only the names are
	// stored; values are read from the secret store when the agent's
	// config is written.
	SecretEnv map[string]string `json:"secret_env,omitempty"`
	AutoPause bool              `json:"auto_pause,omitempty"`
	// AutoPauseMemory is E2B's autoPauseMemory: false makes the timeout
	// pause keep only the filesystem; nil means true.
	AutoPauseMemory *bool           `json:"auto_pause_memory,omitempty"`
	AutoResume      bool            `json:"auto_resume,omitempty"`
	VolumeMounts    json.RawMessage `json:"volume_mounts,omitempty"`
	// Volumes are the parsed volume mounts, in effect; Lifecycle the
	// idle/archive/delete policy (lifecycle.go, volumes.go).
	Volumes   []VolumeMount `json:"volumes,omitempty"`
	Lifecycle Lifecycle     `json:"lifecycle"`

	// Image, set only by template builds (internal/build), is the image of
	// the template store to start on instead of TemplateID's (build.go);
	// never taken from a request.
	Image string `json:"image,omitempty"`
	// Services, set only by template builds with Image, are the services
	// of the template the build is on: its steps run what its sandboxes
	// will (the docker template's engine). Never taken from a request.
	Services []string `json:"services,omitempty"`

	// APIKeyID and TeamID own the sandbox (tenant.Owner): set by Create
	// from the caller, never from the request.
	APIKeyID string `json:"api_key_id,omitempty"`
	TeamID   string `json:"team_id,omitempty"`
	// TrafficAccessToken guards the non-agent ports when the create request
	// set network.allowPublicTraffic to false (api/traffic.go).
	TrafficAccessToken string `json:"traffic_access_token,omitempty"`
	// Insecure is E2B's secure: false: requests to the agent's port need
	// no envd access token (the edge adds it for them) and the create
	// answer has none. The agent itself keeps one, so programs inside the
	// sandbox still cannot use its API (a uid 1000 process running
	// commands as root through 127.0.0.1:49983).
	Insecure bool `json:"insecure,omitempty"`
	// MaskRequestHost is network.maskRequestHost: the Host requests to the
	// sandbox's own ports get (MaskPortPlaceholder = the port).
	MaskRequestHost string `json:"mask_request_host,omitempty"`
}

// MaskPortPlaceholder is replaced by the port in MaskRequestHost (E2B's).
const MaskPortPlaceholder = "${PORT}"

// Owner is who a sandbox made with these options belongs to.
func (o Options) Owner() tenant.Owner { return tenant.Owner{Team: o.TeamID, Key: o.APIKeyID} }

var templateNameRe = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`)

// Normalize fills defaults and rejects values cella cannot honour or the
// operator does not allow (max, resolved), with a message that says which
// field and what is allowed.
func (o *Options) Normalize(max Maxima) error {
	if o.TemplateID == "" {
		o.TemplateID = DefaultTemplate
	}
	if !templateNameRe.MatchString(o.TemplateID) {
		return errdefs.InvalidArgument("invalid template %q: use letters, digits, '.', '_' and '-'", o.TemplateID)
	}
	if o.Timeout < 0 {
		return errdefs.InvalidArgument("timeout must not be negative (got %v)", o.Timeout)
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Timeout > MaxTimeout {
		return errdefs.InvalidArgument("timeout %v is above the maximum of %v", o.Timeout, MaxTimeout)
	}
	if math.IsNaN(o.CPUs) || o.CPUs < 0 || o.MemoryMB < 0 || o.DiskMB < 0 || o.Pids < 0 || o.OutputMB < 0 {
		return errdefs.InvalidArgument("cpus, memory, disk, pids and output limit must not be negative")
	}
	if o.OutputMB == 0 {
		o.OutputMB = DefaultOutputMB
	}
	if o.CPUs == 0 {
		o.CPUs = DefaultCPUs
	}
	builtin := template.Builtins[o.TemplateID]
	if slices.Contains(o.Services, template.ServiceDocker) { // a build on docker
		builtin = template.Builtins[template.DockerName]
	}
	if o.MemoryMB == 0 {
		// A builtin template may need more than the default (the desktop,
		// docker); a build on docker gets what docker does.
		o.MemoryMB = DefaultMemoryMB
		if builtin.MemoryMB > o.MemoryMB {
			o.MemoryMB = builtin.MemoryMB
		}
		if o.MemoryMB > max.MemoryMB && o.MemoryMB != DefaultMemoryMB {
			return errdefs.InvalidArgument("the %s template's default memory of %d MiB is above this daemon's maximum of %d MiB (raise cella serve --max-memory, or ask for less memory)", o.TemplateID, o.MemoryMB, max.MemoryMB)
		}
	}
	if o.DiskMB == 0 {
		o.DiskMB = DefaultDiskMB
		if builtin.DiskMB > o.DiskMB {
			o.DiskMB = builtin.DiskMB
		}
		if o.DiskMB > max.DiskMB && o.DiskMB != DefaultDiskMB {
			return errdefs.InvalidArgument("the %s template's default disk of %d MiB is above this daemon's maximum of %d MiB (raise cella serve --max-disk, or ask for less disk)", o.TemplateID, o.DiskMB, max.DiskMB)
		}
	}
	if o.Pids == 0 {
		o.Pids = DefaultPids
	}
	switch {
	case o.CPUs > max.CPUs:
		return errdefs.InvalidArgument("cpus %g is above this daemon's maximum of %g (cella serve --max-cpus)", o.CPUs, max.CPUs)
	case o.MemoryMB > max.MemoryMB:
		return errdefs.InvalidArgument("memory %d MiB is above this daemon's maximum of %d MiB (cella serve --max-memory)", o.MemoryMB, max.MemoryMB)
	case o.DiskMB > max.DiskMB:
		return errdefs.InvalidArgument("disk %d MiB is above this daemon's maximum of %d MiB (cella serve --max-disk)", o.DiskMB, max.DiskMB)
	case o.Pids > max.Pids:
		return errdefs.InvalidArgument("pids %d is above this daemon's maximum of %d (cella serve --max-pids)", o.Pids, max.Pids)
	case o.OutputMB > MaxOutputMB:
		return errdefs.InvalidArgument("output limit %d MiB is above the maximum of %d MiB", o.OutputMB, MaxOutputMB)
	}
	if o.MemoryMB < 64 {
		return errdefs.InvalidArgument("memory %d MiB is below the minimum of 64 MiB", o.MemoryMB)
	}
	if o.DiskMB < 16 {
		return errdefs.InvalidArgument("disk %d MiB is below the minimum of 16 MiB", o.DiskMB)
	}
	if o.Pids < 16 {
		return errdefs.InvalidArgument("pids %d is below the minimum of 16", o.Pids)
	}
	if err := o.Lifecycle.Validate(); err != nil {
		return err
	}
	for k, v := range o.EnvVars {
		if k == "" || containsAny(k, "=\x00") {
			return errdefs.InvalidArgument("invalid environment variable name %q", k)
		}
		// execve cannot pass it: every command would fail.
		if containsAny(v, "\x00") {
			return errdefs.InvalidArgument("environment variable %q: the value contains a NUL byte", k)
		}
	}
	return nil
}

func containsAny(s, chars string) bool {
	for _, c := range s {
		for _, d := range chars {
			if c == d {
				return true
			}
		}
	}
	return false
}

func mib(n int64) int64 { return n << 20 }

func (o Options) String() string {
	return fmt.Sprintf("template=%s cpus=%g memory=%dMiB disk=%dMiB pids=%d timeout=%v", o.TemplateID, o.CPUs, o.MemoryMB, o.DiskMB, o.Pids, o.Timeout)
}
