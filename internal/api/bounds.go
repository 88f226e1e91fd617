package api

import (
	"math"
	"strconv"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
)

// Every number a request turns into a duration, a time or a size goes
// through one of these: time.Duration(v)*time.Second wraps around for large
// v (18446744074 seconds is 0.29 s), and float-to-int conversions of
// values out of range are whatever the CPU makes of them. Out of range is a
// 400 that names the field and the range, never a wrapped value.

// seconds is a whole number of seconds from 0 to max.
func seconds(field string, v int64, max time.Duration) (time.Duration, error) {
	if v < 0 || v > int64(max/time.Second) {
		return 0, errdefs.InvalidArgument("%s must be between 0 and %d seconds (%v) (got %d)", field, int64(max/time.Second), max, v)
	}
	return time.Duration(v) * time.Second, nil
}

// units is v units (fractions allowed) from 0 to max; unitName names the
// unit in the message ("seconds", "days").
func units(field string, v float64, unit time.Duration, unitName string, max time.Duration) (time.Duration, error) {
	if math.IsNaN(v) || v < 0 || v > float64(max)/float64(unit) {
		return 0, errdefs.InvalidArgument("%s must be between 0 and %s %s (%v) (got %s)", field,
			strconv.FormatFloat(float64(max)/float64(unit), 'f', -1, 64), unitName, max, strconv.FormatFloat(v, 'g', -1, 64))
	}
	return time.Duration(v * float64(unit)), nil
}

// maxUnixTime is the last second of year 9999: times a request names in
// unix seconds stay within it, so that neither time.Unix nor arithmetic on
// the result overflows.
const maxUnixTime = 253402300799

// unixSeconds is a unix time in whole seconds from 0 to maxUnixTime;
// "" is the zero time.
func unixSeconds(field, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > maxUnixTime {
		return time.Time{}, errdefs.InvalidArgument("%s must be a unix time in seconds from 0 to %d (got %q)", field, int64(maxUnixTime), v)
	}
	return time.Unix(n, 0), nil
}
