package archive

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// An object in the archive is sealed as a stream (the STREAM construction
// of Hoang et al., as age uses it): a header of magic and a random salt,
// then chunks of at most chunkSize plaintext bytes, each AES-256-GCM sealed
// with a key derived for this object alone (HKDF-SHA256 of the cluster key,
// the salt and the object's name) and a nonce of the chunk's counter and a
// last-chunk flag. So a flipped bit, a reordered, dropped or appended chunk,
// a cut after any chunk, and an object copied under another sandbox's name
// (its key is derived from the name) all fail to open, before any of their
// plaintext is used.
const (
	magic     = "cellaAR1"
	saltSize  = 16
	chunkSize = 64 << 10
	tagSize   = 16
)

// KeySize is the length of an archive key.
const KeySize = 32

// ErrCorrupt is an object that does not open under the key and name it was
// asked for: tampered, cut, or not sealed for that name.
var ErrCorrupt = errors.New("archive object does not authenticate (tampered, truncated, or sealed for another sandbox)")

func objectAEAD(key, salt []byte, name string) (cipher.AEAD, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("archive key: want %d bytes, got %d", KeySize, len(key))
	}
	sub, err := hkdf.Key(sha256.New, key, salt, "cella-archive/v1 "+name, KeySize)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(sub)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func chunkNonce(n []byte, counter uint64, last bool) {
	clear(n)
	binary.BigEndian.PutUint64(n[3:11], counter)
	if last {
		n[11] = 1
	}
}

// sealer is the writing end of a sealed stream.
type sealer struct {
	w       io.Writer
	aead    cipher.AEAD
	buf     []byte
	out     []byte
	nonce   []byte
	counter uint64
	closed  bool
}

// Seal returns a writer that seals what is written to it into w for the
// object name; Close writes the last chunk (without it the stream does not
// open).
func Seal(w io.Writer, key []byte, name string) (io.WriteCloser, error) {
	salt := make([]byte, saltSize)
	if _, err := rand.Read(salt); err != nil {
		return nil, err
	}
	aead, err := objectAEAD(key, salt, name)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(append([]byte(magic), salt...)); err != nil {
		return nil, err
	}
	return &sealer{w: w, aead: aead, buf: make([]byte, 0, chunkSize), out: make([]byte, 0, chunkSize+tagSize),
		nonce: make([]byte, aead.NonceSize())}, nil
}

func (s *sealer) Write(p []byte) (int, error) {
	if s.closed {
		return 0, errors.New("write to a closed sealer")
	}
	n := 0
	for len(p) > 0 {
		// A full chunk is written only once more follows: the last chunk
		// (flagged) is whatever is left at Close, possibly full.
		if len(s.buf) == chunkSize {
			if err := s.flush(false); err != nil {
				return n, err
			}
		}
		k := copy(s.buf[len(s.buf):chunkSize], p)
		s.buf = s.buf[:len(s.buf)+k]
		p = p[k:]
		n += k
	}
	return n, nil
}

func (s *sealer) flush(last bool) error {
	chunkNonce(s.nonce, s.counter, last)
	s.out = s.aead.Seal(s.out[:0], s.nonce, s.buf, nil)
	s.counter++
	s.buf = s.buf[:0]
	_, err := s.w.Write(s.out)
	return err
}

func (s *sealer) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	return s.flush(true)
}

// opener is the reading end of a sealed stream.
type opener struct {
	r       io.Reader
	aead    cipher.AEAD
	in      []byte // one sealed chunk and the byte after it
	pbuf    []byte // the current chunk's plaintext
	plain   []byte // what is left of it
	nonce   []byte
	counter uint64
	done    bool
	err     error
}

// Open returns a reader of the plaintext of a stream Seal wrote for name.
// Each chunk is authenticated before a byte of it is returned; a stream
// that ends without its last chunk reads as ErrCorrupt, never as EOF.
func Open(r io.Reader, key []byte, name string) (io.Reader, error) {
	hdr := make([]byte, len(magic)+saltSize)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrCorrupt, err)
	}
	if string(hdr[:len(magic)]) != magic {
		return nil, fmt.Errorf("%w: not a sealed cella archive object", ErrCorrupt)
	}
	aead, err := objectAEAD(key, hdr[len(magic):], name)
	if err != nil {
		return nil, err
	}
	return &opener{r: r, aead: aead, in: make([]byte, 0, chunkSize+tagSize+1), pbuf: make([]byte, 0, chunkSize),
		nonce: make([]byte, aead.NonceSize())}, nil
}

func (o *opener) Read(p []byte) (int, error) {
	for len(o.plain) == 0 {
		if o.err != nil {
			return 0, o.err
		}
		if o.done {
			return 0, io.EOF
		}
		o.err = o.next()
	}
	n := copy(p, o.plain)
	o.plain = o.plain[n:]
	return n, nil
}

// next reads and opens one chunk. A chunk is the last when the stream ends
// right after it; the byte read past a full chunk is kept for the next.
func (o *opener) next() error {
	carried := len(o.in) // 0 or 1: the byte read past the previous chunk
	buf := o.in[:chunkSize+tagSize+1]
	n, err := io.ReadFull(o.r, buf[carried:])
	n += carried
	last := false
	switch {
	case err == nil:
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		last = true
	default:
		return err
	}
	sealed := buf[:n]
	if !last {
		sealed = buf[:chunkSize+tagSize]
	}
	chunkNonce(o.nonce, o.counter, last)
	plain, oerr := o.aead.Open(o.pbuf[:0], o.nonce, sealed, nil)
	if oerr != nil {
		return fmt.Errorf("%w: chunk %d", ErrCorrupt, o.counter)
	}
	o.counter++
	o.plain = plain
	o.in = o.in[:0]
	if last {
		o.done = true
	} else {
		o.in = append(o.in, buf[chunkSize+tagSize]) // the next chunk's first byte
	}
	return nil
}
