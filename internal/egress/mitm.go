package egress

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/cella-sandbox/cella/internal/secrets"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 24 * time.Hour
	// leafRenew re-mints a leaf this long before it expires, so that no
	// handshake gets a certificate about to lapse.
	leafRenew = time.Hour
	maxLeaves = 4096
)

// CA is the daemon's interception CA. Sandboxes that use header rules
// must trust its certificate (CertPEM).
type CA struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// LoadOrCreateCA loads ca.pem and ca-key.pem from dir, or creates a new
// ECDSA P-256 CA there (the key readable by its owner only) when either is
// missing: a certificate without its key, or a key without its
// certificate, intercepts nothing.
func LoadOrCreateCA(dir string) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	certPEM, cerr := os.ReadFile(certPath)
	keyPEM, kerr := os.ReadFile(keyPath)
	if cerr == nil && kerr == nil {
		ca, err := parseCA(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("egress: load CA from %s: %w", dir, err)
		}
		return ca, nil
	}
	for _, err := range []error{cerr, kerr} {
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("egress: load CA: %w", err)
		}
	}
	certPEM, keyPEM, err := newCAFiles()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("egress: create CA directory: %w", err)
	}
	// The key first: a certificate on disk then always has its key.
	if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("egress: write CA key: %w", err)
	}
	if err := writeFileAtomic(certPath, certPEM, 0o644); err != nil {
		return nil, fmt.Errorf("egress: write CA certificate: %w", err)
	}
	return parseCA(certPEM, keyPEM)
}

func newCAFiles() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("egress: generate CA key: %w", err)
	}
	now := time.Now()
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          randSerial(),
		Subject:               pkix.Name{CommonName: strings.TrimSpace("cella egress CA " + host), Organization: []string{"cella"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("egress: create CA certificate: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("egress: encode CA key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

func parseCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("ca.pem holds no PEM certificate")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse ca.pem: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("ca.pem is not a CA certificate")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, errors.New("ca-key.pem holds no PEM key")
	}
	var key any
	switch kb.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(kb.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(kb.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("parse ca-key.pem: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, errors.New("ca-key.pem is not a signing key")
	}
	pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("ca-key.pem does not match ca.pem")
	}
	return &CA{cert: cert, key: signer, certPEM: pem.EncodeToMemory(cb), leaves: map[string]*tls.Certificate{}}, nil
}

func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

func randSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		// crypto/rand does not fail on Linux; a fixed serial would still
		// make a valid (if not unique) certificate.
		return big.NewInt(1)
	}
	return n
}

// CertPEM is the CA certificate, for the sandbox's trust store.
func (c *CA) CertPEM() []byte { return bytes.Clone(c.certPEM) }

// leafFor returns a certificate for host signed by the CA, minted on
// first use and cached until shortly before it expires. Leaves are short
// lived so that a leaked one is soon worthless.
func (c *CA) leafFor(host string) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if l, ok := c.leaves[host]; ok && now.Before(l.Leaf.NotAfter.Add(-leafRenew)) {
		return l, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress: generate leaf key for %s: %w", host, err)
	}
	notAfter := now.Add(leafValidity)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randSerial(),
		Subject:               pkix.Name{CommonName: host},
		DNSNames:              []string{host},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("egress: sign leaf for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("egress: parse leaf for %s: %w", host, err)
	}
	if len(c.leaves) >= maxLeaves {
		c.prune(now)
	}
	l := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	c.leaves[host] = l
	return l, nil
}

// prune drops expiring leaves, or an arbitrary one when none is: the cache
// only saves minting.
func (c *CA) prune(now time.Time) {
	for h, l := range c.leaves {
		if !now.Before(l.Leaf.NotAfter.Add(-leafRenew)) {
			delete(c.leaves, h)
		}
	}
	for h := range c.leaves {
		if len(c.leaves) < maxLeaves {
			break
		}
		delete(c.leaves, h)
	}
}

// inject sets a rule's headers (as injectionFor returns them) on a request,
// replacing what the sandbox sent for them.
func (p *Proxy) inject(s *session, host string, h http.Header, names []string, headers map[string]string) *refusal {
	for _, name := range names {
		v, err := s.expand(headers[name], p.cfg.Secrets)
		if err != nil {
			ref := policyRefusal("missing-secret", fmt.Sprintf("the header rule for %s sets %s, but %v", host, name, err))
			ref.status = http.StatusBadGateway
			return ref
		}
		h[name] = []string{v}
	}
	return nil
}

// expand resolves the secrets in a header value template, remembering the
// values so that nothing reported on this connection shows them.
func (s *session) expand(tmpl string, lookup func(string) (string, error)) (string, error) {
	return secrets.Replace(tmpl, func(_, name string) (string, error) {
		if lookup == nil {
			return "", fmt.Errorf("secret %s is not available: this cella resolves no secrets", name)
		}
		v, err := lookup(name)
		if err == nil && v == "" {
			err = errors.New("it is empty")
		}
		if err != nil {
			return "", fmt.Errorf("secret %s is not available: %s", name, s.redact(err.Error()))
		}
		s.remember(name, v)
		if !httpguts.ValidHeaderFieldValue(v) {
			return "", fmt.Errorf("secret %s holds characters not allowed in a header", name)
		}
		return v, nil
	})
}

func (s *session) remember(name, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.secrets[name]; ok && v == value {
		// The usual case on a kept-alive connection: nothing new to redact.
		return
	}
	if s.secrets == nil {
		s.secrets = map[string]string{}
	}
	s.secrets[name] = value
	s.redactor = secrets.NewRedactor(s.secrets, 1)
}

// redact replaces the secret values seen on this connection with
// [secret:NAME], the longest first where values overlap.
func (s *session) redact(text string) string {
	s.mu.Lock()
	r := s.redactor
	s.mu.Unlock()
	if r == nil {
		return text
	}
	return r.Replace(text)
}
