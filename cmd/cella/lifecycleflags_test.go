package main

import (
	"testing"
	"time"
)

// TestEnvLifeDuration: a set variable is read as a life duration, a bad
// one is an error naming it that leaves the default.
func TestEnvLifeDuration(t *testing.T) {
	const env = "CELLA_TEST_LIFE_DURATION"
	for v, want := range map[string]time.Duration{"": time.Hour, "0": 0, "90s": 90 * time.Second, "7d": 7 * 24 * time.Hour, "0.5d": 12 * time.Hour} {
		t.Setenv(env, v)
		d := time.Hour
		if err := envLifeDuration(env, &d); err != nil || d != want {
			t.Errorf("%s=%q: %v, %v; want %v", env, v, d, err, want)
		}
	}
	for _, v := range []string{"soon", "-1h", "-2d", "1x"} {
		t.Setenv(env, v)
		d := time.Hour
		err := envLifeDuration(env, &d)
		if want := env + `: invalid duration "` + v + `" (use e.g. 30s, 15m, 12h or 7d)`; err == nil || err.Error() != want || d != time.Hour {
			t.Errorf("%s=%q: %v, %v; want the default and %q", env, v, d, err, want)
		}
	}
}

// TestServeAuditRetention: --audit-retention defaults to 7 days, or to
// CELLA_AUDIT_RETENTION.
func TestServeAuditRetention(t *testing.T) {
	for v, want := range map[string]string{"": "168h0m0s", "12h": "12h0m0s", "2d": "48h0m0s", "0": "0", "bad": "168h0m0s"} {
		t.Setenv("CELLA_AUDIT_RETENTION", v)
		if got := newServeCmd().Flags().Lookup("audit-retention").Value.String(); got != want {
			t.Errorf("CELLA_AUDIT_RETENTION=%q: default %s, want %s", v, got, want)
		}
	}
}
