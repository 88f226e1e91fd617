package gateway

// MissTTL is how long a gateway answers "no node holds it" for one key and
// sandbox ID without asking the nodes again (holder.go).
const MissTTL = missTTL
