package daemon

import (
	"bytes"
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/cella-sandbox/cella/internal/archive"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/egress"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/sandbox"
	"github.com/cella-sandbox/cella/internal/secrets"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ArchiveConfig keeps paused sandboxes in an S3-compatible object store
// (internal/archive), so that they outlive this host. Empty URL: paused
// sandboxes stay on the host.
type ArchiveConfig struct {
	// URL is s3://BUCKET[/PREFIX] (--archive).
	URL string
	// Endpoint is an S3-compatible server (--archive-endpoint); empty:
	// AWS.
	Endpoint string
}

func (c ArchiveConfig) validate() error {
	if c.URL == "" {
		if c.Endpoint != "" {
			return fieldErr("archive-endpoint", "%q: needs --archive s3://BUCKET/PREFIX", c.Endpoint)
		}
		return nil
	}
	if _, _, err := archive.ParseS3URL(c.URL); err != nil {
		return fieldErr("archive", "%v", err)
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fieldErr("archive-endpoint", "%q: want the http(s)://HOST[:PORT] of an S3-compatible server", c.Endpoint)
		}
	}
	return nil
}

// openArchive opens --archive with its key: the cluster's (a Secret every
// node shares) on a cluster node, else one derived from this host's master
// key (only this daemon can open what it archived).
func (d *Daemon) openArchive(ctx context.Context, c Config) (sandbox.Archive, error) {
	if c.Archive.URL == "" {
		return nil, nil
	}
	var key []byte
	if d.cluster != nil {
		kctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		k, err := cluster.ArchiveKey(kctx, d.cluster, c.Cluster.Namespace)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("the cluster's archive key: %w", err)
		}
		key = k
	} else {
		k, err := StandaloneArchiveKey(c.DataDir)
		if err != nil {
			return nil, err
		}
		key = k
	}
	b, err := archive.NewS3(ctx, archive.S3Config{URL: c.Archive.URL, Endpoint: c.Archive.Endpoint})
	if err != nil {
		return nil, &FieldError{Field: "archive", Err: err}
	}
	a, err := archive.New(b, key)
	if err != nil {
		return nil, err
	}
	d.log.Info("archive: paused sandboxes go to the object store", "archive", a.String(), "endpoint", c.Archive.Endpoint)
	return a, nil
}

// StandaloneArchiveKey is the archive key of a daemon outside a cluster:
// derived from its master key, so a data dir's archive opens with that
// data dir's master.key only (copy it to move the sandboxes with it).
func StandaloneArchiveKey(dataDir string) ([]byte, error) {
	master, err := secrets.LoadOrCreateKey(filepath.Join(dataDir, secrets.KeyFile))
	if err != nil {
		return nil, err
	}
	return hkdf.Key(sha256.New, master, nil, "cella archive key", archive.KeySize)
}

// clusterEgressCA makes this node's egress CA (<data>/egress-ca, what
// newNetwork loads) the cluster's: a sandbox's trust store is in its
// writable layer, which moves with it, so every node's proxy must sign
// with the CA the sandbox trusts. The first node shares its own.
func clusterEgressCA(ctx context.Context, cl client.Client, c Config, log *slog.Logger) error {
	dir := filepath.Join(c.DataDir, "egress-ca")
	certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	local := func() (string, error) {
		if _, err := egress.LoadOrCreateCA(dir); err != nil {
			return "", err
		}
		cert, err := os.ReadFile(certPath)
		if err != nil {
			return "", err
		}
		key, err := os.ReadFile(keyPath)
		return string(cert) + string(key), err
	}
	kctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	shared, err := cluster.EgressCA(kctx, cl, c.Cluster.Namespace, local)
	cancel()
	if err != nil {
		return fmt.Errorf("the cluster's egress CA: %w", err)
	}
	var cert, key []byte
	for rest := []byte(shared); ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			cert = append(cert, pem.EncodeToMemory(b)...)
		} else {
			key = append(key, pem.EncodeToMemory(b)...)
		}
	}
	if len(cert) == 0 || len(key) == 0 {
		return fmt.Errorf("the cluster's egress CA (secret %s/%s) holds no certificate and key", c.Cluster.Namespace, cluster.EgressCASecret)
	}
	if have, err := os.ReadFile(certPath); err == nil && bytes.Equal(have, cert) {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	log.Info("cluster: the egress CA is the cluster's", "secret", cluster.EgressCASecret)
	for _, f := range []struct {
		path string
		b    []byte
	}{{keyPath, key}, {certPath, cert}} {
		if err := writeFileAtomic(f.path, f.b); err != nil {
			return fmt.Errorf("the cluster's egress CA: %w", err)
		}
	}
	return nil
}

// writeFileAtomic writes b to path (0600) through a temporary file.
func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// claim is the manager's Claim on a cluster node: the sandbox's record
// moves to this node; one another live node runs is ErrMoved.
func (d *Daemon) claim(c ClusterConfig) func(ctx context.Context, id string) error {
	if d.cluster == nil {
		return nil
	}
	r := cluster.NewRecords(d.cluster, c.Namespace)
	return func(ctx context.Context, id string) error {
		err := r.Claim(ctx, id, c.NodeName)
		var held *cluster.HeldError
		if errors.As(err, &held) {
			return fmt.Errorf("%w: %w", sandbox.ErrMoved, errdefs.Conflict("%v", held))
		}
		return err
	}
}
