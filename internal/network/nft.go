package network

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// ipsDstNAT is IPS_DST_NAT from linux/netfilter/nf_conntrack_common.h:
// set on a conntrack entry once prerouting rewrote its destination.
const ipsDstNAT = 1 << 5

// installRules programs O's firewall through a netlink socket opened in O
// (outerFD), in one batch so that O never exists with half its rules.
//
// One inet table covers both families so that IPv6 from the sandbox meets
// the same drop policy even if something re-enables IPv6 in O; every accept
// and redirect rule additionally requires IPv4.
func installRules(outerFD int, hostIP netip.Addr, proxyPort, dnsPort int) error {
	c, err := nftables.New(nftables.WithNetNSFd(outerFD))
	if err != nil {
		return fmt.Errorf("nftables connection: %w", err)
	}
	drop := nftables.ChainPolicyDrop
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "cella"})
	nat := c.AddChain(&nftables.Chain{
		Name: "prerouting", Table: t,
		Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting,
		Priority: nftables.ChainPriorityNATDest,
	})
	input := c.AddChain(&nftables.Chain{
		Name: "input", Table: t,
		Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput,
		Priority: nftables.ChainPriorityFilter, Policy: &drop,
	})
	c.AddChain(&nftables.Chain{
		Name: "forward", Table: t,
		Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward,
		Priority: nftables.ChainPriorityFilter, Policy: &drop,
	})

	fromGuest := concat(iifname(hostIfName), isIPv4())

	// TCP to HostIP itself is not redirected: the proxy would only see a
	// connection "to the host", which it must refuse anyway, so the input
	// policy drops it right here instead.
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: concat(fromGuest,
		[]expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: hostIP.AsSlice()},
		},
		l4proto(unix.IPPROTO_TCP), redirect(proxyPort))})
	// DNS is redirected whatever the destination, HostIP included, so a
	// resolv.conf naming either the host side or a public resolver works.
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: concat(fromGuest,
		l4proto(unix.IPPROTO_UDP), dport(53), redirect(dnsPort))})

	c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
		accept(),
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: concat(iifname("lo"), []expr.Any{accept()})})
	// Only flows the prerouting chain redirected are accepted, so the
	// sandbox cannot reach the proxy ports by addressing HostIP directly
	// (such a connection would carry no original destination).
	c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: concat(fromGuest,
		l4proto(unix.IPPROTO_TCP), dport(proxyPort), wasRedirected(), []expr.Any{accept()})})
	c.AddRule(&nftables.Rule{Table: t, Chain: input, Exprs: concat(fromGuest,
		l4proto(unix.IPPROTO_UDP), dport(dnsPort), wasRedirected(), []expr.Any{accept()})})

	if err := c.Flush(); err != nil {
		return fmt.Errorf("install nftables rules: %w", err)
	}
	return nil
}

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// iifname matches the input interface by name; the kernel compares the
// whole IFNAMSIZ buffer, hence the padding.
func iifname(name string) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

func isIPv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

// dport reads the destination port, which sits at the same offset in TCP
// and UDP headers; callers match l4proto first.
func dport(port int) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(port))},
	}
}

func redirect(port int) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(port))},
		&expr.Redir{RegisterProtoMin: 1},
	}
}

func wasRedirected() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func accept() expr.Any { return &expr.Verdict{Kind: expr.VerdictAccept} }
