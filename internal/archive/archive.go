// Package archive keeps paused sandboxes in an S3-compatible object store
// (`cella serve --archive s3://BUCKET/PREFIX`), so that they outlive their
// node: any node of the cluster with the archive's key can bring one back.
//
// The agent binaries sandboxes were archived with are kept once each under
// agents/<sha256> (content-addressed, never deleted: a handful of
// versions). A sandbox is two objects under sandboxes/<id>/: "state", its writable
// layer and memory checkpoint as one tar.gz (the sandbox package's
// format), and "manifest", what a node needs to resume it (owner,
// template and its digest, runtime, agent binary digest, the state's
// sha256 and size, the sandbox's record). Both are sealed (seal.go) with
// the cluster's archive key: a memory checkpoint holds every value the
// sandbox's processes had — secret environment variables, tokens, whatever
// a program read — so nothing goes to the store in clear. Reading checks
// the seal chunk by chunk and then the state's sha256 and size against the
// manifest. The package knows nothing of HTTP or of sandboxes' internals.
package archive

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"regexp"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
)

// Format is the manifest format this package writes and reads.
const Format = 1

// timeoutAbort bounds the clean-up of a failed upload.
const timeoutAbort = 30 * time.Second

// Manifest is what a node needs to resume an archived sandbox.
type Manifest struct {
	Format    int    `json:"format"`
	SandboxID string `json:"sandboxID"`
	// Team and KeyID own the sandbox (tenant.Owner).
	Team  string `json:"team"`
	KeyID string `json:"keyID,omitempty"`
	// Template is the sandbox's template ID and TemplateDigest the digest
	// of the image it ran on: a node resumes it only on that image.
	Template       string `json:"template"`
	TemplateDigest string `json:"templateDigest"`
	// Runtime is the runtime that paused it (a checkpoint is gVisor's).
	Runtime   string `json:"runtime"`
	PauseMode string `json:"pauseMode"`
	// Agent is the sha256 of the agent binary the sandbox's memory holds.
	Agent string `json:"agent"`
	// State is the digest of the state object's plaintext.
	State Digest `json:"state"`
	// Record is the node's own record of the sandbox (options, tokens),
	// StartedAt and EndAt its columns; AgentConfig the agent's config
	// for a cold boot and Origin what a sandbox made from a snapshot
	// stacks on (the sandbox package's files, as they are).
	Record      json.RawMessage `json:"record"`
	StartedAt   time.Time       `json:"startedAt"`
	EndAt       time.Time       `json:"endAt"`
	AgentConfig []byte          `json:"agentConfig,omitempty"`
	Origin      []byte          `json:"origin,omitempty"`
	// Node archived it, at ArchivedAt.
	Node       string    `json:"node,omitempty"`
	ArchivedAt time.Time `json:"archivedAt"`
}

// Digest is a stream's sha256 and length.
type Digest struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Archive is a Bucket with its key: sealed sandbox objects.
type Archive struct {
	b   Bucket
	key []byte
}

// New is the archive in b sealed with key (KeySize bytes).
func New(b Bucket, key []byte) (*Archive, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("archive key: want %d bytes, got %d", KeySize, len(key))
	}
	return &Archive{b: b, key: append([]byte(nil), key...)}, nil
}

func (a *Archive) String() string { return a.b.String() }

// IDs are the sandbox package's: lower-case letters and digits. Anything
// else never becomes part of an object key.
var validID = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

func objectName(id, object string) (string, error) {
	if !validID.MatchString(id) {
		return "", errdefs.InvalidArgument("sandbox ID %q: want 1-64 lower-case letters and digits", id)
	}
	return "sandboxes/" + id + "/" + object, nil
}

// PutState seals and uploads what write writes as sandbox id's state,
// streaming, and returns its digest (for the manifest).
func (a *Archive) PutState(ctx context.Context, id string, write func(io.Writer) error) (Digest, error) {
	name, err := objectName(id, "state")
	if err != nil {
		return Digest{}, err
	}
	var d Digest
	err = a.put(ctx, name, func(w io.Writer) error {
		h := &hashCount{h: sha256.New()}
		if err := write(io.MultiWriter(w, h)); err != nil {
			return err
		}
		d = Digest{SHA256: hex.EncodeToString(h.h.Sum(nil)), Size: h.n}
		return nil
	})
	return d, err
}

// put streams write's output, sealed for name, to the bucket.
func (a *Archive) put(ctx context.Context, name string, write func(io.Writer) error) error {
	pr, pw := io.Pipe()
	go func() {
		sw, err := Seal(pw, a.key, name)
		if err == nil {
			err = write(sw)
		}
		if err == nil {
			err = sw.Close()
		}
		pw.CloseWithError(err)
	}()
	err := a.b.Put(ctx, name, pr)
	pr.CloseWithError(errors.New("upload ended")) // unblocks the writer if Put stopped early
	return err
}

// OpenState downloads sandbox id's state and hands its plaintext to read
// as it arrives; read's input stops with ErrCorrupt at the first chunk
// that does not authenticate. After read, the rest is drained and the
// whole is checked against want: a mismatch is an error even when read
// succeeded (the caller then discards what it extracted).
func (a *Archive) OpenState(ctx context.Context, id string, want Digest, read func(io.Reader) error) error {
	name, err := objectName(id, "state")
	if err != nil {
		return err
	}
	r, closeObj, err := a.get(ctx, name)
	if err != nil {
		return err
	}
	defer closeObj()
	h := &hashCount{h: sha256.New()}
	tr := io.TeeReader(r, h)
	if err := read(tr); err != nil {
		return fmt.Errorf("archived state of %s: %w", id, err)
	}
	if _, err := io.Copy(io.Discard, tr); err != nil {
		return fmt.Errorf("archived state of %s: %w", id, err)
	}
	got := Digest{SHA256: hex.EncodeToString(h.h.Sum(nil)), Size: h.n}
	if got != want {
		return fmt.Errorf("%w: state of %s is sha256 %s (%d bytes), its manifest says %s (%d bytes)", ErrCorrupt, id, got.SHA256, got.Size, want.SHA256, want.Size)
	}
	return nil
}

// get opens the sealed object name for reading; closeObj ends the
// download.
func (a *Archive) get(ctx context.Context, name string) (r io.Reader, closeObj func(), err error) {
	rc, err := a.b.Get(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	if r, err = Open(rc, a.key, name); err != nil {
		rc.Close()
		return nil, nil, err
	}
	return r, func() { rc.Close() }, nil
}

// PutManifest seals and uploads m (under m.SandboxID): written after the
// state, it is what makes an archive complete.
func (a *Archive) PutManifest(ctx context.Context, m Manifest) error {
	name, err := objectName(m.SandboxID, "manifest")
	if err != nil {
		return err
	}
	m.Format = Format
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return a.put(ctx, name, func(w io.Writer) error { _, err := w.Write(b); return err })
}

// maxManifest bounds a manifest (a record is a few KiB).
const maxManifest = 4 << 20

// Manifest reads sandbox id's manifest: errdefs.KindNotFound when the
// sandbox has none, ErrCorrupt when it does not authenticate as id's.
func (a *Archive) Manifest(ctx context.Context, id string) (Manifest, error) {
	var m Manifest
	name, err := objectName(id, "manifest")
	if err != nil {
		return m, err
	}
	r, closeObj, err := a.get(ctx, name)
	if err != nil {
		return m, err
	}
	defer closeObj()
	b, err := io.ReadAll(io.LimitReader(r, maxManifest+1))
	if err != nil {
		return m, fmt.Errorf("archived manifest of %s: %w", id, err)
	}
	if len(b) > maxManifest {
		return m, fmt.Errorf("archived manifest of %s: over %d bytes", id, maxManifest)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("archived manifest of %s: %w", id, err)
	}
	switch {
	case m.Format != Format:
		return m, errdefs.FailedPrecondition("archived manifest of %s: format %d, this node reads %d", id, m.Format, Format)
	case m.SandboxID != id:
		// Sealed for this name, so only a holder of the key wrote it.
		return m, fmt.Errorf("%w: the manifest under %s is sandbox %q's", ErrCorrupt, id, m.SandboxID)
	}
	return m, nil
}

var validDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)

// PutAgent uploads an agent binary (the text a checkpoint's memory holds)
// under agents/<sha256>, sealed: content-addressed, so every sandbox
// archived with one binary shares one object, and a node that runs
// another can restore them with this one.
func (a *Archive) PutAgent(ctx context.Context, digest string, r io.Reader) error {
	if !validDigest.MatchString(digest) {
		return errdefs.InvalidArgument("agent digest %q: want 64 hex digits", digest)
	}
	name := "agents/" + digest
	return a.put(ctx, name, func(w io.Writer) error {
		h := sha256.New()
		if _, err := io.Copy(io.MultiWriter(w, h), r); err != nil {
			return err
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != digest {
			return fmt.Errorf("agent binary is sha256 %s, not %s", got, digest)
		}
		return nil
	})
}

// GetAgent writes the agent binary of digest to w and checks it is that
// binary: an error leaves w's content unusable.
func (a *Archive) GetAgent(ctx context.Context, digest string, w io.Writer) error {
	if !validDigest.MatchString(digest) {
		return errdefs.InvalidArgument("agent digest %q: want 64 hex digits", digest)
	}
	name := "agents/" + digest
	r, closeObj, err := a.get(ctx, name)
	if err != nil {
		return err
	}
	defer closeObj()
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(w, h), r); err != nil {
		return fmt.Errorf("archived agent %s: %w", digest, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != digest {
		return fmt.Errorf("%w: archived agent %s is sha256 %s", ErrCorrupt, digest, got)
	}
	return nil
}

// Delete removes sandbox id's objects, the manifest first (so a half-done
// delete leaves no manifest naming a missing state).
func (a *Archive) Delete(ctx context.Context, id string) error {
	var errs []error
	for _, o := range []string{"manifest", "state"} {
		name, err := objectName(id, o)
		if err != nil {
			return err
		}
		if err := a.b.Delete(ctx, name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

type hashCount struct {
	h hash.Hash
	n int64
}

func (h *hashCount) Write(p []byte) (int, error) {
	h.n += int64(len(p))
	return h.h.Write(p)
}
