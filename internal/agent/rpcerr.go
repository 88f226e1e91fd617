package agent

import "github.com/cella-sandbox/cella/internal/errdefs"

// rpcError is where the agent's Connect services (envd's process and
// filesystem) turn an error's errdefs kind into its Connect code, once per
// method (deferred), so the code of every failure comes from errdefs' one
// table. An error without a kind (a send to a client that left, a stream's
// own failure) passes as it is, as before.
func rpcError(err *error) {
	if errdefs.HasKind(*err) {
		*err = errdefs.ToConnect(*err)
	}
}
