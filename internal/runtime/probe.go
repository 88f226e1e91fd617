package runtime

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
)

// ProbePrefix starts the ID of every probe container a runtime named name
// runs with state in stateDir. It carries a hash of stateDir, so that
// daemons (and tests) on one host can tell their probes from each other's.
func ProbePrefix(name, stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return "cella-probe-" + name + "-" + hex.EncodeToString(sum[:4]) + "-"
}

// NewProbeID returns a fresh probe container ID with the given prefix.
func NewProbeID(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}
