package agent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// File metadata (envd 0.6.2): the X-Metadata-<key> headers of an upload are
// kept as the file's extended attributes user.e2b.<key>, and list, stat and
// watch entries report them. They travel with the inode, so a rename keeps
// them; an upload replaces the whole set, so an overwrite without headers
// clears what an earlier upload stored.
const metadataXattrPrefix = "user.e2b."

// Limits of a metadata set, envd's: an xattr name is at most 255 bytes, and
// ext4 keeps all of an inode's xattrs in one 4 KiB block.
const (
	maxMetadataKeyLen   = 255 - len(metadataXattrPrefix)
	maxMetadataTotalLen = 4096
)

// validateMetadata refuses a set the filesystem could not keep, naming the
// key or limit: keys and values printable US-ASCII, keys non-empty.
func validateMetadata(meta map[string]string) error {
	total := 0
	for k, v := range meta {
		if k == "" {
			return errors.New("metadata key must not be empty")
		}
		if len(k) > maxMetadataKeyLen {
			return fmt.Errorf("metadata key %q exceeds %d bytes", k, maxMetadataKeyLen)
		}
		if i := strings.IndexFunc(k+v, func(r rune) bool { return r < 0x20 || r > 0x7e }); i >= 0 {
			return fmt.Errorf("metadata %q: keys and values must be printable US-ASCII (X-Metadata-* headers)", k)
		}
		total += len(metadataXattrPrefix) + len(k) + len(v)
	}
	if total > maxMetadataTotalLen {
		return fmt.Errorf("total metadata size %d exceeds %d bytes (names with the %s prefix plus values)", total, maxMetadataTotalLen, metadataXattrPrefix)
	}
	return nil
}

// xattrUnsupported is a filesystem that keeps no user xattrs (procfs, some
// tmpfs): the file is written, its metadata is not.
func xattrUnsupported(err error) bool {
	return errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP)
}

// listXattrs returns the xattr names list fills (listxattr or flistxattr),
// growing the buffer while the set changes under it.
func listXattrs(list func([]byte) (int, error)) ([]string, error) {
	size, err := list(nil)
	for err == nil {
		if size == 0 {
			return nil, nil
		}
		buf := make([]byte, size)
		var n int
		if n, err = list(buf); err == nil {
			var names []string
			for _, name := range bytes.Split(buf[:n], []byte{0}) {
				if len(name) > 0 {
					names = append(names, string(name))
				}
			}
			return names, nil
		}
		if errors.Is(err, unix.ERANGE) {
			size, err = list(nil)
		}
	}
	return nil, err
}

// readMetadata returns the metadata stored on path (nil if none or the
// filesystem keeps none). Best effort, as envd's: an entry is still
// reported when its xattrs cannot be read. Values set from inside the
// sandbox (setfattr) that are not UTF-8 are left out: the answer's map
// could not carry them.
func readMetadata(path string) map[string]string {
	names, err := listXattrs(func(b []byte) (int, error) { return unix.Listxattr(path, b) })
	if err != nil {
		return nil
	}
	var meta map[string]string
	for _, name := range names {
		key, ok := strings.CutPrefix(name, metadataXattrPrefix)
		if !ok {
			continue
		}
		value, err := getXattr(func(b []byte) (int, error) { return unix.Getxattr(path, name, b) })
		if err != nil || !utf8.ValidString(key) || !utf8.Valid(value) {
			continue
		}
		if meta == nil {
			meta = map[string]string{}
		}
		meta[key] = string(value)
	}
	return meta
}

func getXattr(get func([]byte) (int, error)) ([]byte, error) {
	for {
		size, err := get(nil)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, size)
		n, err := get(buf)
		if errors.Is(err, unix.ERANGE) {
			continue // it grew in between
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// writeMetadata makes meta the metadata of the open file f: stored keys
// absent from meta are removed (an O_TRUNC keeps xattrs, and an overwrite
// must not keep stale metadata), the others set. Through the descriptor,
// so a path swapped meanwhile cannot redirect it.
func writeMetadata(f *os.File, meta map[string]string) error {
	fd := int(f.Fd())
	names, err := listXattrs(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) })
	if err != nil {
		return fmt.Errorf("list xattrs: %w", err)
	}
	for _, name := range names {
		key, ok := strings.CutPrefix(name, metadataXattrPrefix)
		if _, keep := meta[key]; !ok || keep {
			continue
		}
		if err := unix.Fremovexattr(fd, name); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("remove metadata %s: %w", key, err)
		}
	}
	for k, v := range meta {
		if err := unix.Fsetxattr(fd, metadataXattrPrefix+k, []byte(v), 0); err != nil {
			return fmt.Errorf("store metadata %s: %w", k, err)
		}
	}
	return nil
}
