package audit

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// Prune removes the logs of sandboxes that no longer exist (keep reports
// false) and whose last entry is older than retention: a killed sandbox's
// record stays readable for a while, then goes, so logs do not pile up.
// It returns how many logs it removed.
func (l *Log) Prune(retention time.Duration, keep func(sandboxID string) bool) (int, error) {
	l.Flush()
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return 0, fmt.Errorf("prune audit logs: %w", err)
	}
	n := 0
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".jsonl")
		if !ok || !validID(id) || keep(id) {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < retention {
			continue
		}
		if err := l.Remove(id); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
