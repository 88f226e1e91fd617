package network

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
)

// Defaults used by DefaultConfig and by Validate for zero fields.
const (
	DefaultRunDir    = "/run/cella/net"
	DefaultPoolSize  = 4
	DefaultProxyPort = 15001
	DefaultDNSPort   = 15053
)

// DefaultPrefix is the slot subnet when Config.Prefix is unset. Sandboxes
// cannot reach real hosts inside it, so it is a small, rarely used block.
var DefaultPrefix = netip.MustParsePrefix("10.200.0.0/30")

// Config says how slots are made. Start from DefaultConfig: the zero
// PoolSize means "no pool", not "default".
type Config struct {
	// Prefix holds the two slot addresses: its first host is HostIP (in O),
	// the second GuestIP (in S). Every slot uses the same ones, so
	// destinations inside Prefix are unreachable from a sandbox; keep it
	// small. Must be IPv4, /30 or larger. Zero means DefaultPrefix.
	Prefix netip.Prefix
	// RunDir holds the namespace bind mounts. It must belong to one
	// Manager: New reaps whatever it finds there. Empty means
	// DefaultRunDir.
	RunDir string
	// PoolSize is how many slots are kept made in advance; 0 makes every
	// slot on demand.
	PoolSize int
	// ProxyPort and DNSPort are the ports, inside O, that sandbox TCP and
	// DNS traffic is redirected to. Zero means the defaults.
	ProxyPort, DNSPort int
	// Adoptable names slots a previous daemon left in RunDir that
	// sandboxes still running may use: New leaves them for Adopt instead of
	// reaping them, and ReapUnadopted removes those nobody adopted.
	Adoptable []string
}

// DefaultConfig returns the configuration the daemon uses unless told
// otherwise.
func DefaultConfig() Config {
	return Config{
		Prefix:    DefaultPrefix,
		RunDir:    DefaultRunDir,
		PoolSize:  DefaultPoolSize,
		ProxyPort: DefaultProxyPort,
		DNSPort:   DefaultDNSPort,
	}
}

// Validate fills zero fields (except PoolSize) with their defaults and
// reports the first invalid one.
func (c *Config) Validate() error {
	if !c.Prefix.IsValid() {
		c.Prefix = DefaultPrefix
	}
	if c.RunDir == "" {
		c.RunDir = DefaultRunDir
	}
	if c.ProxyPort == 0 {
		c.ProxyPort = DefaultProxyPort
	}
	if c.DNSPort == 0 {
		c.DNSPort = DefaultDNSPort
	}
	c.Prefix = c.Prefix.Masked()
	if !c.Prefix.Addr().Is4() {
		return fmt.Errorf("network config: prefix %s is not IPv4", c.Prefix)
	}
	if c.Prefix.Bits() > 30 {
		return fmt.Errorf("network config: prefix %s is smaller than /30 (needs two host addresses)", c.Prefix)
	}
	if !filepath.IsAbs(c.RunDir) {
		return fmt.Errorf("network config: run dir %q is not absolute", c.RunDir)
	}
	c.RunDir = filepath.Clean(c.RunDir)
	if c.PoolSize < 0 {
		return errors.New("network config: negative pool size")
	}
	for _, p := range []struct {
		name string
		port int
	}{{"proxy", c.ProxyPort}, {"dns", c.DNSPort}} {
		if p.port < 1 || p.port > 65535 {
			return fmt.Errorf("network config: %s port %d out of range", p.name, p.port)
		}
	}
	if c.ProxyPort == c.DNSPort {
		return fmt.Errorf("network config: proxy and dns port are both %d", c.ProxyPort)
	}
	return nil
}

// HostIP (every slot's gateway and nameserver) and guestIP are the first
// two hosts of a validated prefix.
func (c *Config) HostIP() netip.Addr  { return c.Prefix.Addr().Next() }
func (c *Config) guestIP() netip.Addr { return c.Prefix.Addr().Next().Next() }
