package agent

import (
	"compress/gzip"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
)

// fileEntry is an element of POST /files' answer.
type fileEntry struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// checkFilesAuth implements envd's validateSigning: with a token set, the
// request needs the token header or a valid, unexpired signature.
func (s *Server) checkFilesAuth(r *http.Request, operation string) error {
	token := s.config().AccessToken
	if token == "" {
		return nil
	}
	if h := r.Header.Get(agentapi.AccessTokenHeader); h != "" {
		if !tokenEqual(h, token) {
			return errors.New("access token present in header but does not match")
		}
		return nil
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return errors.New(agentapi.UnauthorizedMessage)
	}
	var exp int64
	if v := q.Get("signature_expiration"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return errors.New("invalid signature expiration")
		}
		exp = n
	}
	want := agentapi.Signature(q.Get("path"), operation, q.Get("username"), token, exp)
	if subtle.ConstantTimeCompare([]byte(want), []byte(sig)) != 1 {
		return errors.New("invalid signature")
	}
	if exp != 0 && exp < time.Now().Unix() {
		return errors.New("signature is already expired")
	}
	return nil
}

func (s *Server) handleDownload(w http.ResponseWriter, r *http.Request) {
	if err := s.checkFilesAuth(r, "read"); err != nil {
		jsonError(w, http.StatusUnauthorized, err)
		return
	}
	u, err := s.fileUser(r)
	if err != nil {
		jsonError(w, http.StatusUnauthorized, err)
		return
	}
	p, err := s.resolve(r.URL.Query().Get("path"), u)
	if err != nil {
		jsonError(w, http.StatusBadRequest, err)
		return
	}
	gz, err := wantsGzip(r)
	if err != nil {
		jsonError(w, http.StatusNotAcceptable, err)
		return
	}
	// Opened as the user, so a symlink the user planted leads only where
	// the user may read; the open file is then served without rights.
	f, st, code, err := openForDownload(p, u)
	if err != nil {
		jsonError(w, code, err)
		return
	}
	defer f.Close()
	w.Header().Set("Vary", "Accept-Encoding")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": filepath.Base(p)}))
	// Range and conditional requests keep http.ServeContent's semantics
	// (206, 304); Accept-Encoding is only advisory.
	if gz && r.Header.Get("Range") == "" && r.Header.Get("If-Modified-Since") == "" &&
		r.Header.Get("If-None-Match") == "" && r.Header.Get("If-Range") == "" {
		ct := mime.TypeByExtension(filepath.Ext(p))
		if ct == "" {
			ct = "application/octet-stream"
		}
		w.Header().Set("Content-Type", ct)
		w.Header().Set("Content-Encoding", "gzip")
		// BestSpeed: at the default level compressing cost more time than
		// it saved on the sandbox's link (the E2B SDKs ask for gzip).
		bw := newBulkResponse(w) // bulk.go
		defer bw.done()
		zw, _ := gzip.NewWriterLevel(bw, gzip.BestSpeed) // a valid level: no error
		if _, err := io.Copy(zw, f); err == nil {
			_ = zw.Close()
		}
		return
	}
	bw := newBulkResponse(w)
	defer bw.done()
	http.ServeContent(bw, r, p, st.ModTime(), f)
}

// openForDownload opens the regular file p as u.
func openForDownload(p string, u *sandboxUser) (*os.File, fs.FileInfo, int, error) {
	var f *os.File
	var st fs.FileInfo
	err := u.do(func() error {
		var err error
		if st, err = os.Stat(p); err != nil {
			return err
		}
		if st.IsDir() {
			return nil
		}
		// O_NONBLOCK: a fifo swapped in after the stat must not hang the
		// request; it is refused below like any non-regular file.
		if f, err = os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0); err != nil {
			return err
		}
		st, err = f.Stat()
		return err
	})
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil, http.StatusNotFound, fmt.Errorf("path '%s' does not exist", p)
	case errors.Is(err, fs.ErrPermission):
		return nil, nil, http.StatusForbidden, u.denied("read", p, err)
	case err != nil:
		if f != nil {
			f.Close()
		}
		return nil, nil, http.StatusInternalServerError, fmt.Errorf("error opening file '%s': %w", p, err)
	case st.IsDir():
		if f != nil {
			f.Close()
		}
		return nil, nil, http.StatusBadRequest, fmt.Errorf("path '%s' is a directory", p)
	case !st.Mode().IsRegular():
		f.Close()
		return nil, nil, http.StatusBadRequest, fmt.Errorf("path '%s' is not a regular file", p)
	}
	return f, st, 0, nil
}

// wantsGzip parses Accept-Encoding: gzip if acceptable, identity otherwise;
// an error when the client accepts neither.
func wantsGzip(r *http.Request) (bool, error) {
	h := r.Header.Get("Accept-Encoding")
	if h == "" {
		return false, nil
	}
	q := map[string]float64{}
	for _, part := range strings.Split(h, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		weight := 1.0
		if v, ok := strings.CutPrefix(strings.TrimSpace(params), "q="); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				weight = f
			}
		}
		q[strings.ToLower(strings.TrimSpace(name))] = weight
	}
	if w, ok := q["gzip"]; ok && w > 0 {
		return true, nil
	}
	if w, ok := q["identity"]; ok && w == 0 {
		return false, errors.New("no acceptable encoding: only gzip and identity are supported")
	}
	if w, ok := q["*"]; ok && w == 0 {
		if _, listed := q["identity"]; !listed {
			return false, errors.New("no acceptable encoding: only gzip and identity are supported")
		}
	}
	return false, nil
}

func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request) {
	defer r.Body.Close()
	if err := s.checkFilesAuth(r, "write"); err != nil {
		jsonError(w, http.StatusUnauthorized, err)
		return
	}
	u, err := s.fileUser(r)
	if err != nil {
		jsonError(w, http.StatusUnauthorized, err)
		return
	}
	body := io.Reader(r.Body)
	if strings.EqualFold(strings.TrimSpace(r.Header.Get("Content-Encoding")), "gzip") {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			jsonError(w, http.StatusBadRequest, fmt.Errorf("error decompressing request body: %w", err))
			return
		}
		defer zr.Close()
		body = zr
	}
	meta := uploadMetadata(r.Header)
	if err := validateMetadata(meta); err != nil {
		jsonError(w, http.StatusBadRequest, fmt.Errorf("invalid metadata: %w", err))
		return
	}
	mediaType, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	query := r.URL.Query()
	var entries []fileEntry
	switch {
	case mediaType == "application/octet-stream":
		if !query.Has("path") {
			jsonError(w, http.StatusBadRequest, errors.New("path query parameter is required for raw body upload"))
			return
		}
		e, code, err := s.writeUpload(query.Get("path"), body, u, meta)
		if err != nil {
			s.uploadError(w, code, err)
			return
		}
		entries = append(entries, e)
	case strings.HasPrefix(mediaType, "multipart/"):
		mr := multipart.NewReader(body, params["boundary"])
		seen := map[string]bool{}
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				jsonError(w, http.StatusBadRequest, fmt.Errorf("error reading form: %w", err))
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			target := query.Get("path")
			if !query.Has("path") {
				// Part.FileName() would apply filepath.Base; the SDK puts
				// the full destination path in filename.
				target = partFileName(part)
			}
			if target == "" {
				part.Close()
				jsonError(w, http.StatusBadRequest, errors.New("file part has no filename and no path query parameter was given"))
				return
			}
			abs, _ := s.resolve(target, u)
			if seen[abs] {
				part.Close()
				jsonError(w, http.StatusBadRequest, fmt.Errorf("you cannot upload multiple files to the same path '%s' in one upload request", abs))
				return
			}
			seen[abs] = true
			e, code, err := s.writeUpload(target, part, u, meta)
			part.Close()
			if err != nil {
				s.uploadError(w, code, err)
				return
			}
			entries = append(entries, e)
		}
		if len(entries) == 0 {
			jsonError(w, http.StatusBadRequest, errors.New("no file part in the multipart form"))
			return
		}
	default:
		jsonError(w, http.StatusBadRequest, fmt.Errorf("unsupported content type: %s, expected multipart/form-data or application/octet-stream", r.Header.Get("Content-Type")))
		return
	}
	writeJSON(w, http.StatusOK, entries)
}

// uploadError names the disk limit when a write ran out of space.
func (s *Server) uploadError(w http.ResponseWriter, code int, err error) {
	if limit := s.config().Limits.DiskBytes; code == http.StatusInsufficientStorage && limit > 0 {
		err = fmt.Errorf("%s: %w", uploadDiskReason(limit), err)
	}
	jsonError(w, code, err)
}

// partFileName returns the filename parameter of a part's
// Content-Disposition as sent, path included.
func partFileName(part *multipart.Part) string {
	_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// uploadMetadata collects X-Metadata-<key> headers (keys lowercased).
func uploadMetadata(h http.Header) map[string]string {
	var meta map[string]string
	for k, vs := range h {
		if key, ok := strings.CutPrefix(strings.ToLower(k), "x-metadata-"); ok && key != "" && len(vs) > 0 {
			if meta == nil {
				meta = map[string]string{}
			}
			meta[key] = vs[0]
		}
	}
	return meta
}

// writeUpload writes one uploaded file like envd's processFile, except
// that everything happens as the user: missing parents are created by (so
// owned by) the user, and the file is opened as the user, following
// symlinks only where the user could, and truncated. A new file belongs to
// the user; an existing one keeps its owner. It returns the HTTP status to
// use on error.
func (s *Server) writeUpload(target string, data io.Reader, u *sandboxUser, meta map[string]string) (fileEntry, int, error) {
	p, err := s.resolve(target, u)
	if err != nil {
		return fileEntry{}, http.StatusBadRequest, err
	}
	var n int64
	var stored map[string]string // the metadata as read back
	code := 0
	err = u.do(func() error {
		if err := ensureDirs(filepath.Dir(p)); err != nil {
			code = statusFor(err)
			return fmt.Errorf("error ensuring directories: %w", u.denied("create directories for", p, err))
		}
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			code = http.StatusBadRequest
			return fmt.Errorf("path is a directory: %s", p)
		}
		// O_NONBLOCK: a fifo at p fails (ENXIO) instead of hanging the
		// request until someone reads it.
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NONBLOCK, 0o644)
		if errors.Is(err, syscall.ENXIO) {
			code = http.StatusBadRequest
			return fmt.Errorf("path is not a regular file: %s", p)
		}
		if err != nil {
			code = statusFor(err)
			return fmt.Errorf("error opening file: %w", u.denied("write", p, err))
		}
		defer f.Close()
		if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
			code = http.StatusBadRequest
			return fmt.Errorf("path is not a regular file: %s", p)
		}
		body := &bodyReader{r: data}
		if n, err = copyFilled(f, body); err != nil { // bulk.go
			if body.err != nil {
				// The client's upload ended early or was malformed.
				code = http.StatusBadRequest
				return fmt.Errorf("error reading the upload: %w", err)
			}
			code = statusFor(err)
			return fmt.Errorf("error writing file: %w", err)
		}
		if err := writeMetadata(f, meta); err != nil {
			switch {
			case xattrUnsupported(err):
				// The file is written; its filesystem keeps no metadata,
				// and the answer does not claim any (read back below).
				if len(meta) > 0 {
					slog.Warn("upload metadata not stored: the filesystem keeps no user xattrs", "path", p, "err", err)
				}
			case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.E2BIG):
				code = http.StatusInsufficientStorage
				return fmt.Errorf("not enough space for file metadata: %w", err)
			default:
				code = http.StatusInternalServerError
				return fmt.Errorf("error writing file metadata: %w", err)
			}
		}
		if err := f.Close(); err != nil {
			code = statusFor(err)
			return fmt.Errorf("error writing file: %w", err)
		}
		// Read back in the same call as the user: another would be
		// another hand-off to a user's thread and its switches
		// (asuser), each a trip through gVisor's sentry.
		stored = readMetadata(p)
		return nil
	})
	if err != nil {
		if code == 0 {
			code = http.StatusInternalServerError
		}
		s.audit.emit(agentapi.AuditEvent{Kind: "file.write", Path: p, Size: n, User: u.Name, Error: err.Error()})
		return fileEntry{}, code, err
	}
	s.audit.emit(agentapi.AuditEvent{Kind: "file.write", Path: p, Size: n, User: u.Name})
	return fileEntry{Path: p, Name: filepath.Base(p), Type: "file", Metadata: stored}, 0, nil
}

// bodyReader keeps the error of reading an upload, which is the client's,
// apart from the errors of writing it.
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// statusFor maps a write error to its HTTP status; a full disk is 507,
// which the SDK turns into NotEnoughSpaceError.
func statusFor(err error) int {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return http.StatusInsufficientStorage
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR),
		errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.ELOOP):
		// What the path names is wrong: a file where a directory is
		// wanted, a name too long, a loop of the sandbox's own symlinks.
		return http.StatusBadRequest
	case errors.Is(err, fs.ErrPermission):
		return http.StatusForbidden
	}
	return http.StatusInternalServerError
}
