package cluster

// Halt stops renewing without releasing the Lease: the node as a kill -9
// leaves it.
func (n *Node) Halt() { n.halt() }

// KindOf exposes the error mapping to the tests.
func KindOf(err error) error { return kindOf(err, "test") }
