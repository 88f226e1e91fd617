// Package network gives each sandbox a network "slot": a pair of network
// namespaces wired so that everything the sandbox sends can only reach the
// daemon, which then decides (in the egress proxy, another package) what
// may go further.
//
// The packet path of a sandbox's outbound TCP connection or DNS query:
//
//	sandbox process
//	  → gVisor netstack (runsc --network=sandbox), or the kernel for crun
//	  → eth0 in the sandbox namespace S (GuestIP, default route via HostIP)
//	  → veth pair
//	  → cella0 in the outer namespace O (HostIP)
//	  → O's reverse-path filter drops any source other than GuestIP
//	  → nftables in O: prerouting redirects every TCP connection (except
//	    to HostIP itself) to ProxyPort and every UDP/53 datagram to
//	    DNSPort; input accepts only those redirected flows and drops
//	    everything else (ICMP, other UDP, IPv6, TCP to HostIP)
//	  → the daemon's listener socket in O (Slot.Listener, Slot.DNS)
//	  → the egress proxy reads the original destination (OriginalDst),
//	    applies policy and dials upstream from the root namespace.
//
// Why two namespaces instead of one veth into the root namespace: O holds
// nothing but its half of the veth, so there is no route anywhere, and the
// host's root namespace never gains an interface, address, route or
// firewall rule per sandbox. A bug in the rules can at worst let the sandbox
// talk to O, which has nothing else in it. The daemon itself stays in the
// root namespace; only its listener sockets live in O (a socket belongs to
// the namespace it was created in for its whole life).
//
// Why every slot has the same addresses: slots are told apart by namespace,
// not address, so a gVisor checkpoint taken in one slot restores into any
// other one (the netstack remembers its addresses, routes and neighbour
// entries, which is also why the veth MAC addresses are fixed). Two
// sandboxes cannot reach each other because each O only contains its own
// veth.
//
// Slots are single use: gVisor takes over eth0 and removes its addresses,
// so a slot is never handed out twice. The Manager keeps a few made in
// advance because making one costs a few milliseconds of netlink round
// trips.
//
// Namespaces are kept alive by bind mounts under Config.RunDir
// (<id>-s and <id>-o), which is what the OCI spec's network namespace path
// points at and what Reap cleans up after a daemon crash. To look inside
// one while debugging:
//
//	nsenter --net=/run/cella/net/<id>-o nft list ruleset
package network
