package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// KeyFile is the master key's file name in the data dir.
const KeyFile = "master.key"

// KeySize is the master key's length: an AES-256 key.
const KeySize = 32

// format is the first byte of every ciphertext, so a later scheme can be
// told apart from this one (AES-256-GCM, 12-byte nonce, name as AAD).
const format byte = 1

// Box seals and opens secret values under the master key.
type Box struct {
	aead cipher.AEAD
}

// NewBox makes a Box from a raw 32-byte key.
func NewBox(key []byte) (*Box, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("master key is %d bytes, want %d", len(key), KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("master key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("master key: %w", err)
	}
	return &Box{aead: aead}, nil
}

// OpenBox loads <dataDir>/master.key, creating it on first use.
func OpenBox(dataDir string) (*Box, error) {
	key, err := LoadOrCreateKey(filepath.Join(dataDir, KeyFile))
	if err != nil {
		return nil, err
	}
	return NewBox(key)
}

// additionalData binds a ciphertext to its secret's name: a ciphertext
// copied under another name in the database fails to open instead of
// handing one secret's value out as another's.
func additionalData(name string) []byte { return []byte("cella-secret/v1/" + name) }

// Seal encrypts value for the secret name. Each call draws a fresh random
// nonce, stored in front of the ciphertext.
func (b *Box) Seal(name string, value []byte) ([]byte, error) {
	ns := b.aead.NonceSize()
	out := make([]byte, 1+ns, 1+ns+len(value)+b.aead.Overhead())
	out[0] = format
	if _, err := io.ReadFull(rand.Reader, out[1:]); err != nil {
		return nil, fmt.Errorf("draw nonce: %w", err)
	}
	return b.aead.Seal(out, out[1:1+ns], value, additionalData(name)), nil
}

// ErrDecrypt is returned when a ciphertext does not open: a different
// master key, a tampered value, or a ciphertext of another secret.
var ErrDecrypt = errors.New("ciphertext does not open under this master key (wrong master.key, tampered, or moved from another name)")

// Open decrypts a ciphertext made by Seal for the same name.
func (b *Box) Open(name string, ciphertext []byte) ([]byte, error) {
	ns := b.aead.NonceSize()
	if len(ciphertext) < 1+ns+b.aead.Overhead() {
		return nil, fmt.Errorf("ciphertext is too short (%d bytes): %w", len(ciphertext), ErrDecrypt)
	}
	if ciphertext[0] != format {
		return nil, fmt.Errorf("unknown ciphertext format %d", ciphertext[0])
	}
	pt, err := b.aead.Open(nil, ciphertext[1:1+ns], ciphertext[1+ns:], additionalData(name))
	if err != nil {
		return nil, ErrDecrypt
	}
	return pt, nil
}

// LoadOrCreateKey reads the master key at path, or makes one there. An
// existing file of the wrong size, or one that group or others may access,
// is refused: a short key is a corrupt file, and a readable one is a key
// that may already have leaked, which the operator must decide about.
func LoadOrCreateKey(path string) ([]byte, error) {
	key, err := loadKey(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return key, err
	}
	key = make([]byte, KeySize)
	if _, err := io.ReadFull(rand.Reader, key); err != nil {
		return nil, fmt.Errorf("generate master key: %w", err)
	}
	if err := writeKey(path, key); err != nil {
		if errors.Is(err, os.ErrExist) {
			// Another process made it first: use theirs.
			return loadKey(path)
		}
		return nil, err
	}
	return key, nil
}

func loadKey(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("open master key: %w", err)
	}
	defer f.Close()
	// Check the opened file, not the path, so a swap between the check and
	// the read cannot slip another file in.
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat master key %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("master key %s is not a regular file (%s)", path, fi.Mode().Type())
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("master key %s has mode %04o: group and others must have no access (fix with: chmod 600 %s)", path, perm, path)
	}
	if fi.Size() != KeySize {
		return nil, fmt.Errorf("master key %s is %d bytes, want %d: the file is corrupt (restore it from a backup; without it the stored secrets cannot be decrypted)", path, fi.Size(), KeySize)
	}
	key := make([]byte, KeySize)
	if _, err := io.ReadFull(f, key); err != nil {
		return nil, fmt.Errorf("read master key %s: %w", path, err)
	}
	return key, nil
}

// writeKey creates path with key, complete or not at all: the key goes to a
// temporary file that is then hard-linked into place, which fails (ErrExist)
// instead of replacing a key another process wrote meanwhile.
func writeKey(path string, key []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, ".master.key-*")
	if err != nil {
		return fmt.Errorf("create master key: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("chmod master key: %w", err)
	}
	if _, err := tmp.Write(key); err != nil {
		tmp.Close()
		return fmt.Errorf("write master key: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync master key: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write master key: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return err
		}
		return fmt.Errorf("install master key %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
