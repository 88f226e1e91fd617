package builds

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
)

// The files cache: the tar of each COPY step's sources, uploaded by the
// client to a URL that authorizes itself (E2B §4.4), kept per team by the
// client's filesHash (an opaque key: the server cannot recompute it).
//
//	<dir>/upload.key               the HMAC key of upload URLs (0600)
//	<dir>/files/<team>/<hash>.tar  an uploaded archive (gzipped or not)

// UploadTTL is how long an upload URL is valid (E2B's 30 minutes).
const UploadTTL = 30 * time.Minute

// MaxUploadBytes bounds one uploaded archive.
const MaxUploadBytes int64 = 4 << 30

var teamRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

func (s *Service) filesDir(team string) string { return filepath.Join(s.cfg.Dir, "files", team) }

func (s *Service) filePath(team, hash string) string {
	return filepath.Join(s.filesDir(team), hash+".tar")
}

// loadKey reads the upload key, making it on first use: URLs stay valid
// across a restart of the daemon.
func loadKey(dir string) ([]byte, error) {
	p := filepath.Join(dir, "upload.key")
	b, err := os.ReadFile(p)
	if err == nil {
		k, err := hex.DecodeString(strings.TrimSpace(string(b)))
		if err != nil || len(k) < 32 {
			return nil, fmt.Errorf("upload key %s is damaged (remove it: outstanding upload URLs stop working)", p)
		}
		return k, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read upload key: %w", err)
	}
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(hex.EncodeToString(k)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("write upload key: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return nil, fmt.Errorf("write upload key: %w", err)
	}
	return k, nil
}

// sign is the token of an upload of hash for template, into team's cache,
// valid until expires.
func (s *Service) sign(templateID, hash, team string, expires int64) string {
	m := hmac.New(sha256.New, s.key)
	fmt.Fprintf(m, "cella-upload\x00%s\x00%s\x00%s\x00%d", templateID, hash, team, expires)
	return hex.EncodeToString(m.Sum(nil))
}

// uploadQuery is the query of an upload URL.
func (s *Service) uploadQuery(templateID, hash, team string, now time.Time) string {
	exp := now.Add(UploadTTL).Unix()
	v := url.Values{}
	v.Set("team", team)
	v.Set("expires", strconv.FormatInt(exp, 10))
	v.Set("token", s.sign(templateID, hash, team, exp))
	return v.Encode()
}

// FileLink is E2B's TemplateBuildFileUpload.
type FileLink struct {
	Present bool
	// Path and Query make the upload URL: PUT <origin><Path>?<Query>.
	Path, Query string
}

// FileLink answers GET /templates/{id}/files/{hash}: whether the caller's
// team has the archive, and a signed URL to upload it (always, as E2B
// does: forceUpload uploads even a present one).
func (s *Service) FileLink(ctx context.Context, c Caller, templateID, hash string) (FileLink, error) {
	if !hashRE.MatchString(hash) {
		return FileLink{}, errdefs.InvalidArgument("Invalid files hash %q: a files hash is 64 lower-case hex digits (sha256)", hash)
	}
	t, err := s.ownedTemplate(ctx, c, templateID)
	if err != nil {
		return FileLink{}, err
	}
	_, err = os.Stat(s.filePath(t.TeamID, hash))
	return FileLink{Present: err == nil, Path: "/templates/" + url.PathEscape(t.ID) + "/files/" + hash,
		Query: s.uploadQuery(t.ID, hash, t.TeamID, time.Now())}, nil
}

// Upload stores the body of PUT <upload URL> once its token checks out: the
// URL is the only credential (the client sends no key). A wrong, tampered
// or expired token is a 403.
func (s *Service) Upload(ctx context.Context, templateID, hash string, q url.Values, body io.Reader) error {
	team, exp, token := q.Get("team"), q.Get("expires"), q.Get("token")
	if team == "" || exp == "" || token == "" {
		return errdefs.InvalidArgument("upload URL is missing its team, expires or token parameter (ask GET /templates/{templateID}/files/{hash} for one)")
	}
	expires, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || !hashRE.MatchString(hash) || !teamRE.MatchString(team) ||
		!hmac.Equal([]byte(token), []byte(s.sign(templateID, hash, team, expires))) {
		return errdefs.Forbidden("invalid or expired upload token")
	}
	if time.Now().Unix() > expires {
		return errdefs.Forbidden("invalid or expired upload token (expired %s)", time.Unix(expires, 0).UTC().Format(time.RFC3339))
	}
	dir := s.filesDir(team)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("files cache: %w", err)
	}
	f, err := os.CreateTemp(dir, ".upload-*")
	if err != nil {
		return fmt.Errorf("files cache: %w", err)
	}
	defer os.Remove(f.Name()) // after the rename: a no-op
	n, err := io.Copy(f, io.LimitReader(body, MaxUploadBytes+1))
	if err == nil && n > MaxUploadBytes {
		err = errdefs.InvalidArgument("the upload is larger than %d GiB, the most one COPY step's files may be", MaxUploadBytes>>30)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errdefs.KindOf(err) == errdefs.KindInternal {
			return fmt.Errorf("store upload %s: %w", hash, err)
		}
		return err
	}
	if err := os.Rename(f.Name(), s.filePath(team, hash)); err != nil {
		return fmt.Errorf("store upload %s: %w", hash, err)
	}
	return nil
}

// teamFiles is build.Files over one team's cache.
type teamFiles struct {
	s    *Service
	team string
}

func (f teamFiles) Open(_ context.Context, hash string) (io.ReadCloser, error) {
	if !hashRE.MatchString(hash) {
		return nil, fmt.Errorf("invalid files hash %q", hash)
	}
	r, err := os.Open(f.s.filePath(f.team, hash))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("the files of hash %s were not uploaded (the client uploads them before the build starts)", hash)
	}
	return r, err
}
