package agentapi

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestSignature checks the signed-URL signature against values computed
// outside Go (sha256sum | base64, padding removed), as E2B's SDKs compute
// them: a change of the format would lock every SDK out of /files.
func TestSignature(t *testing.T) {
	for _, c := range []struct {
		path, op, user, token string
		exp                   int64
		want                  string
	}{
		{"/home/user/a.txt", "read", "user", "tok123", 1700000000, "v1_V+Uu+RuPgK3z3SyT4Wv9NjsTMFBou2vkE1dnhJOU0HE"},
		{"/x", "write", "", "tok", 0, "v1_3F/SRsYOox8MX1Xmocxew1e8wUcQkt2PQJNXa2aBno4"},
	} {
		if got := Signature(c.path, c.op, c.user, c.token, c.exp); got != c.want {
			t.Errorf("Signature(%q, %q, %q, %q, %d) = %s, want %s", c.path, c.op, c.user, c.token, c.exp, got, c.want)
		}
	}
}

func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{SandboxID: "sb", AccessToken: "tok", EnvVars: map[string]string{"A": "b"},
		Limits: Limits{MemoryBytes: 1 << 29, Pids: 256}, Services: []string{ServiceCodeInterpreter}}
	if err := WriteConfig(dir, cfg); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, ConfigName))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("config mode %v: it holds tokens, root only", st.Mode().Perm())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("files left beside the config: %v", ents)
	}
	got, err := ReadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, cfg) || !got.HasService(ServiceCodeInterpreter) || got.HasService("other") {
		t.Fatalf("read back %+v, want %+v", got, cfg)
	}
	if _, err := ReadConfig(t.TempDir()); err == nil || !strings.Contains(err.Error(), "read agent config") {
		t.Fatalf("missing config: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ConfigName), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadConfig(dir); err == nil || !strings.Contains(err.Error(), "parse agent config") {
		t.Fatalf("broken config: %v", err)
	}
}

// TestProcessLogsPath: the path the daemon builds is the one the agent's
// pattern serves, with the pid as its value.
func TestProcessLogsPath(t *testing.T) {
	mux := http.NewServeMux()
	var pid string
	mux.HandleFunc("GET "+ProcessLogsPattern, func(w http.ResponseWriter, r *http.Request) { pid = r.PathValue("pid") })
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", ProcessLogsPath(4711), nil))
	if rec.Code != 200 || pid != "4711" {
		t.Fatalf("%s: %d, pid %q", ProcessLogsPath(4711), rec.Code, pid)
	}
}

func TestAuthExempt(t *testing.T) {
	for _, c := range []struct {
		method, path string
		want         bool
	}{
		{"GET", HealthPath, true}, {"GET", FilesPath, true}, {"POST", FilesPath, true}, {"POST", InitPath, true},
		{"POST", ChannelTokenPath, true},
		{"POST", HealthPath, false}, {"GET", InitPath, false}, {"GET", EnvsPath, false}, {"GET", EventsPath, false},
		{"GET", TarPath, false}, {"GET", WaitPath, false}, {"POST", "/process.Process/Start", false},
		{"GET", "/files/", false}, {"GET", "/health/x", false},
	} {
		if got := AuthExempt(c.method, c.path); got != c.want {
			t.Errorf("AuthExempt(%s %s) = %v, want %v", c.method, c.path, got, c.want)
		}
	}
}

func TestUserAuthorization(t *testing.T) {
	h := UserAuthorization("user")
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(h, "Basic "))
	if !strings.HasPrefix(h, "Basic ") || err != nil || string(b) != "user:" {
		t.Fatalf("UserAuthorization(user) = %q (%s, %v)", h, b, err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", h)
	if u, p, ok := r.BasicAuth(); !ok || u != "user" || p != "" {
		t.Fatalf("net/http reads %q as %q %q %v", h, u, p, ok)
	}
}
