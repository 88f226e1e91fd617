// Package agentbin holds the sandbox agent's binary (cmd/cella-agent) inside
// cella, so that cella stays one file to install while its sandboxes run a
// small agent of their own. `make build` builds the agent into dist/ before
// it builds cella; a cella built without it (`go build ./cmd/cella` in a
// fresh checkout) compiles, and Binary says what to do instead of serving
// sandboxes with no agent.
package agentbin

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
)

// dist holds dist/.keep always (so that the pattern matches in a fresh
// checkout) and dist/cella-agent once `make build` has made it.
//
//go:embed all:dist
var dist embed.FS

// Name is the agent binary's file name in dist/.
const Name = "cella-agent"

// ErrMissing is Binary's error for a cella built without its agent.
var ErrMissing = errors.New("this cella binary holds no sandbox agent: it was built without internal/agentbin/dist/" + Name +
	" (build cella with 'make build', which builds cmd/cella-agent into it first)")

// Binary returns the embedded agent binary.
func Binary() ([]byte, error) {
	b, err := dist.ReadFile("dist/" + Name)
	if errors.Is(err, fs.ErrNotExist) || err == nil && len(b) == 0 {
		return nil, ErrMissing
	}
	if err != nil {
		return nil, fmt.Errorf("read the embedded agent: %w", err)
	}
	return b, nil
}
