package api_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/audit"
	"github.com/cella-sandbox/cella/internal/store"
)

type logsV1 struct {
	Logs []struct {
		Timestamp time.Time `json:"timestamp"`
		Line      string    `json:"line"`
	} `json:"logs"`
	LogEntries []struct {
		Timestamp time.Time         `json:"timestamp"`
		Level     string            `json:"level"`
		Message   string            `json:"message"`
		Fields    map[string]string `json:"fields"`
	} `json:"logEntries"`
	Entries []audit.Entry `json:"entries"`
}

type logsV2 struct {
	Logs []struct {
		Timestamp time.Time         `json:"timestamp"`
		Level     string            `json:"level"`
		Message   string            `json:"message"`
		Fields    map[string]string `json:"fields"`
	} `json:"logs"`
	Entries []audit.Entry `json:"entries"`
}

func TestAuditLogsAPI(t *testing.T) {
	e := startLight(t, true, true)
	key := e.userKey // the owner's key; values are redacted anyway
	if _, err := e.secrets.Set(context.Background(), "GH_TOKEN", "ghp_leaky_value"); err != nil {
		t.Fatal(err)
	}
	// The sandbox is gone; who owned it is recorded beside its log.
	if err := e.store.PutSandboxOwner(context.Background(), "isb1", e.userTeam, "k"); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e.audit.Append(audit.Entry{Time: t0, SandboxID: "isb1", Kind: audit.KindLifecycle, Source: audit.SourceDaemon, Message: "created"})
	e.audit.Append(audit.Entry{Time: t0.Add(time.Second), SandboxID: "isb1", Kind: audit.KindDNS, Source: audit.SourceProxy, Host: "github.com", Decision: audit.DecisionAllowed})
	e.audit.Append(audit.Entry{Time: t0.Add(2 * time.Second), SandboxID: "isb1", Kind: audit.KindConnect, Source: audit.SourceProxy,
		Host: "evil.example", Dst: "203.0.113.9:443", Decision: audit.DecisionBlocked, Rule: "default", Reason: "not in the allowlist"})
	e.audit.Append(audit.Entry{Time: t0.Add(3 * time.Second), SandboxID: "isb1", Kind: audit.KindProcessStart, Source: audit.SourceAgent,
		PID: 7, Cmd: "echo ghp_leaky_value"})

	for _, path := range []string{"/sandboxes/isb1/logs", "/v2/sandboxes/isb1/logs"} {
		st, _, body := e.do(t, "GET", path, key, nil, nil)
		if st != 200 {
			t.Fatalf("%s: %d %s", path, st, body)
		}
		if strings.Contains(string(body), "ghp_leaky_value") || !strings.Contains(string(body), "[secret:GH_TOKEN]") {
			t.Fatalf("%s: not redacted: %s", path, body)
		}
	}

	st, _, body := e.do(t, "GET", "/sandboxes/isb1/logs", key, nil, nil)
	var v1 logsV1
	if err := json.Unmarshal(body, &v1); err != nil || st != 200 {
		t.Fatalf("v1: %d %s", st, body)
	}
	if len(v1.Logs) != 4 || len(v1.LogEntries) != 4 || len(v1.Entries) != 4 {
		t.Fatalf("v1 counts: %s", body)
	}
	blocked := v1.LogEntries[2]
	if blocked.Level != "warn" || v1.LogEntries[1].Level != "info" ||
		blocked.Message != `connect blocked host=evil.example dst=203.0.113.9:443 rule=default reason="not in the allowlist"` ||
		!v1.Logs[2].Timestamp.Equal(t0.Add(2*time.Second)) ||
		blocked.Fields["decision"] != "blocked" || blocked.Fields["dst"] != "203.0.113.9:443" || blocked.Fields["sandboxId"] != "isb1" ||
		v1.Entries[2].Rule != "default" || v1.Entries[3].PID != 7 {
		t.Fatalf("v1 shape: %s", body)
	}

	// E2B's v1 lines are JSON objects (the E2B CLI parses them).
	var line map[string]string
	if err := json.Unmarshal([]byte(v1.Logs[2].Line), &line); err != nil || line["level"] != "warn" || line["logger"] != "connect" ||
		line["message"] != blocked.Message || line["sandboxID"] != "isb1" || line["dst"] != "203.0.113.9:443" {
		t.Fatalf("v1 line: %q %v", v1.Logs[2].Line, err)
	}

	for _, tc := range []struct {
		query string
		hosts []string // the entries' Host (or Message) in order
	}{
		{"?kind=connect,dns", []string{"github.com", "evil.example"}},
		{"?decision=blocked", []string{"evil.example"}},
		{"?since=" + t0.Add(2*time.Second).Format(time.RFC3339), []string{"evil.example", "pid7"}},
		{"?since=" + t0.Add(time.Second).Format(time.RFC3339Nano) + "&kind=dns", []string{"github.com"}},
		{"?start=" + strconv.FormatInt(t0.Add(3*time.Second).UnixMilli(), 10), []string{"pid7"}},
		{"?limit=2", []string{"evil.example", "pid7"}},
	} {
		st, _, body := e.do(t, "GET", "/sandboxes/isb1/logs"+tc.query, key, nil, nil)
		var r logsV1
		json.Unmarshal(body, &r)
		if st != 200 || len(r.Entries) != len(tc.hosts) {
			t.Fatalf("%s: %d %s", tc.query, st, body)
		}
		for i, h := range tc.hosts {
			got := r.Entries[i].Host
			if r.Entries[i].PID != 0 {
				got = "pid" + strconv.Itoa(r.Entries[i].PID)
			}
			if got != h {
				t.Fatalf("%s: entry %d is %q, want %q: %s", tc.query, i, got, h, body)
			}
		}
	}

	// v2: E2B's structured "logs", and backward reading from a cursor.
	st, _, body = e.do(t, "GET", "/v2/sandboxes/isb1/logs?direction=backward&limit=2&cursor="+strconv.FormatInt(t0.Add(2*time.Second).UnixMilli(), 10), key, nil, nil)
	var v2 logsV2
	if err := json.Unmarshal(body, &v2); err != nil || st != 200 {
		t.Fatalf("v2: %d %s", st, body)
	}
	if len(v2.Logs) != 2 || v2.Logs[0].Level != "warn" || v2.Entries[0].Host != "evil.example" || v2.Entries[1].Host != "github.com" ||
		!strings.HasPrefix(v2.Logs[1].Message, "dns allowed host=github.com") {
		t.Fatalf("v2 backward: %s", body)
	}

	t.Run("BadQuery", func(t *testing.T) {
		for q, contains := range map[string]string{
			"?since=yesterday":        "since must be",
			"?kind=connect,bogus":     "unknown kind",
			"?decision=maybe":         "decision must be",
			"?limit=0":                "limit must be",
			"?limit=10001":            "limit must be",
			"?limit=x":                "limit must be",
			"?since=1&start=2":        "one of since",
			"?direction=backward":     "direction",
			"?direction=sideways&x=1": "direction",
		} {
			st, _, b := e.do(t, "GET", "/sandboxes/isb1/logs"+q, key, nil, nil)
			e.wantError(t, 400, st, b, contains)
		}
	})

	// Another team's key: the answer of an unknown sandbox; the admin
	// reads every log.
	_, other, err := e.store.CreateAPIKey(context.Background(), store.NewKey{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	st, _, body = e.do(t, "GET", "/sandboxes/isb1/logs", other, nil, nil)
	e.wantError(t, 404, st, body, `sandbox "isb1" not found`)
	if st, _, body = e.do(t, "GET", "/v2/sandboxes/isb1/logs", e.adminKey, nil, nil); st != 200 {
		t.Fatalf("the admin reading a log: %d %s", st, body)
	}

	// Unknown sandbox without a file: 404; a gone sandbox's file is still
	// served; once removed it is 404.
	st, _, body = e.do(t, "GET", "/sandboxes/nope/logs", key, nil, nil)
	e.wantError(t, 404, st, body, "nope")
	st, _, body = e.do(t, "GET", "/v2/sandboxes/nope/logs", key, nil, nil)
	e.wantError(t, 404, st, body, "nope")
	st, _, body = e.do(t, "GET", "/sandboxes/isb1/logs", "", nil, nil)
	e.wantError(t, 401, st, body, "")
	if err := e.audit.Remove("isb1"); err != nil {
		t.Fatal(err)
	}
	st, _, body = e.do(t, "GET", "/sandboxes/isb1/logs", key, nil, nil)
	e.wantError(t, 404, st, body, "isb1")
}

func TestAuditLogsAPINotConfigured(t *testing.T) {
	e := startLight(t, false, false)
	for _, p := range []string{"/sandboxes/x/logs", "/v2/sandboxes/x/logs"} {
		st, _, body := e.do(t, "GET", p, e.adminKey, nil, nil)
		e.wantError(t, 501, st, body, "audit log")
	}
}
