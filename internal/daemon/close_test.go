package daemon

import (
	"bytes"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

// TestCloseNamesFailures: Close runs every closer in reverse order of
// registration, logs each failure with the closer's name, goes on past it,
// and returns every failure.
func TestCloseNamesFailures(t *testing.T) {
	var logBuf bytes.Buffer
	d := &Daemon{log: slog.New(slog.NewTextHandler(&logBuf, nil))}
	var order []string
	closeAs := func(name string, err error) func() error {
		return func() error { order = append(order, name); return err }
	}
	d.add("store", closeAs("store", nil))
	d.add("runtime", closeAs("runtime", errors.New("runtime is stuck")))
	d.add("network", closeAs("network", nil))
	d.add("audit log", closeAs("audit log", errors.New("disk full")))
	d.add("api", closeAs("api", nil))

	err := d.Close()
	if want := []string{"api", "audit log", "network", "runtime", "store"}; !slices.Equal(order, want) {
		t.Fatalf("closed %v, want %v", order, want)
	}
	if err == nil || !strings.Contains(err.Error(), "close runtime: runtime is stuck") || !strings.Contains(err.Error(), "close audit log: disk full") {
		t.Fatalf("Close: %v; want both failures named", err)
	}
	logged := logBuf.String()
	for _, want := range []string{`closer=runtime err="runtime is stuck"`, `closer="audit log" err="disk full"`} {
		if !strings.Contains(logged, want) {
			t.Errorf("the log has no %s:\n%s", want, logged)
		}
	}
	for _, ok := range []string{"closer=store", "closer=network", "closer=api"} {
		if strings.Contains(logged, ok) {
			t.Errorf("a closer that succeeded is logged as failed (%s):\n%s", ok, logged)
		}
	}
	// Closing again closes nothing twice.
	order = nil
	if err := d.Close(); err != nil || len(order) != 0 {
		t.Fatalf("second Close: %v, closed %v", err, order)
	}
}
