package quota

import (
	"strings"
	"testing"
	"time"
)

func TestParseRate(t *testing.T) {
	for in, want := range map[string]Rate{
		"": {}, "0": {}, "60/m": {60, time.Minute}, "100/s": {100, time.Second}, "5/h": {5, time.Hour},
		"1/d": {1, 24 * time.Hour}, "5/10s": {5, 10 * time.Second}, " 2/m ": {2, time.Minute},
	} {
		got, err := ParseRate(in)
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if again, err := ParseRate(got.String()); err != nil || again != got {
			t.Errorf("%q: String %q does not read back: %+v %v", in, got.String(), again, err)
		}
	}
	for in, msg := range map[string]string{
		"60": "want N/s", "x/m": "N must be an integer", "0/m": "N must be an integer", "-1/m": "N must be",
		"5/fortnight": "the period must be", "5/100ms": "from 1s to 7d", "5/720h": "from 1s to 7d", "2000000/s": "1000000",
	} {
		if _, err := ParseRate(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseRate(%q): %v; want an error containing %q", in, err, msg)
		}
	}
}

// TestBuckets: N at once, then a refusal that says when; a refused take
// takes nothing; more than N at once never fits; buckets are per ID and
// start over when the rate changes. The rate (1/h) refills nothing while
// the test runs.
func TestBuckets(t *testing.T) {
	var b Buckets
	r := Rate{N: 3, Per: time.Hour}
	if ok, _ := b.Take("a", r, 2); !ok {
		t.Fatal("2 of 3 refused")
	}
	if ok, retry := b.Take("a", r, 2); ok || retry <= 0 {
		t.Fatalf("2 more of 3: ok=%v retry=%v", ok, retry)
	}
	if ok, _ := b.Take("a", r, 1); !ok {
		t.Fatal("the refused take took tokens")
	}
	// One token comes back every 20 minutes.
	if ok, retry := b.Take("a", r, 1); ok || retry < 15*time.Minute || retry > 20*time.Minute {
		t.Fatalf("an empty bucket of 3/h: ok=%v retry=%v", ok, retry)
	}
	if ok, retry := b.Take("b", r, 4); ok || retry != 0 {
		t.Fatalf("4 at once of 3: ok=%v retry=%v", ok, retry)
	}
	if ok, _ := b.Take("b", r, 3); !ok {
		t.Fatal("another ID shares a's bucket")
	}
	if ok, _ := b.Take("a", Rate{N: 5, Per: time.Hour}, 5); !ok {
		t.Fatal("a new rate kept the old bucket")
	}
	if ok, _ := b.Take("a", Rate{}, 1000); !ok {
		t.Fatal("the zero rate limited")
	}
	if RetryAfter(1500*time.Millisecond) != 2 || RetryAfter(time.Millisecond) != 1 || RetryAfter(time.Hour) != 3600 {
		t.Fatal("RetryAfter does not round up to whole seconds")
	}
}
