// Package s3test runs a real S3 server for tests: versitygw (Apache-2.0),
// the binary `make cluster-deps` builds into /var/cache/cella-k8s, on
// loopback with a free port, its own data directory (posix backend) and
// fresh credentials. Nothing of S3 is faked.
//
// Tests that use it run wherever the binary is built (it is on this
// machine's CI, which caches it), fail under CELLA_TEST_CLUSTER=1 when it
// is missing, and skip otherwise.
package s3test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/cella-sandbox/cella/internal/clusterdeps"
)

// Server is one running versitygw.
type Server struct {
	// Endpoint is its http://127.0.0.1:PORT.
	Endpoint string
	// Access and Secret are its credentials; Bucket a bucket made for the
	// test.
	Access, Secret, Bucket string
	// Dir is its posix backend's directory (buckets are directories).
	Dir string
}

// Binary finds versitygw, skipping the test where it is not built.
func Binary(t testing.TB) string {
	t.Helper()
	b, err := clusterdeps.Lookup()
	if err == nil && b.Versitygw != "" {
		if _, serr := os.Stat(b.Versitygw); serr == nil {
			return b.Versitygw
		}
	}
	if clusterdeps.Enabled() {
		t.Fatalf("versitygw is not built (make cluster-deps): %v", err)
	}
	t.Skipf("needs versitygw (make cluster-deps): %v", err)
	return ""
}

// Start runs versitygw until the test ends, with one bucket.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := Binary(t)
	s := &Server{Access: "cella" + token(4), Secret: token(16), Bucket: "cella-" + token(4), Dir: t.TempDir()}
	data := filepath.Join(s.Dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ { // a free port can be taken between the probe and the bind
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		log, err := os.Create(filepath.Join(s.Dir, fmt.Sprintf("versitygw-%d.log", attempt)))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "--access", s.Access, "--secret", s.Secret, "--port", addr, "posix", data)
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
		if err := cmd.Start(); err != nil {
			log.Close()
			t.Fatalf("start versitygw: %v", err)
		}
		log.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-done
		})
		s.Endpoint = "http://" + addr
		if lastErr = s.waitReady(done); lastErr == nil {
			break
		}
		_ = cmd.Process.Kill()
		<-done
	}
	if lastErr != nil {
		t.Fatalf("versitygw: %v", lastErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &s.Bucket}); err != nil {
		t.Fatalf("create bucket %s: %v", s.Bucket, err)
	}
	return s
}

// waitReady waits for the server's port to answer HTTP (any status: an
// anonymous request is refused, which is an answer).
func (s *Server) waitReady(done chan struct{}) error {
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(s.Endpoint + "/")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("exited before it answered (%v)", err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer after 1m: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Env is the AWS environment that points the SDK's default configuration
// at this server's credentials (the endpoint is a flag of its own).
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + s.Access, "AWS_SECRET_ACCESS_KEY=" + s.Secret, "AWS_REGION=us-east-1",
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}
}

// SetEnv sets Env in this process until the test ends (for daemons run in
// it).
func (s *Server) SetEnv(t testing.TB) {
	for _, kv := range s.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

// URL is s3://BUCKET/PREFIX of the test's bucket.
func (s *Server) URL(prefix string) string { return "s3://" + s.Bucket + "/" + prefix }

// Client is an S3 client of the server with its credentials.
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{Region: "us-east-1", BaseEndpoint: aws.String(s.Endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(s.Access, s.Secret, "")})
}

// Keys lists the object keys in the test's bucket, but those holding any
// of skip.
func (s *Server) Keys(t testing.TB, skip ...string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var keys []string
	p := s3.NewListObjectsV2Paginator(s.Client(), &s3.ListObjectsV2Input{Bucket: &s.Bucket})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			t.Fatalf("list %s: %v", s.Bucket, err)
		}
	next:
		for _, o := range out.Contents {
			for _, sk := range skip {
				if strings.Contains(*o.Key, sk) {
					continue next
				}
			}
			keys = append(keys, *o.Key)
		}
	}
	return keys
}

// Object reads the object at key k, raw (as stored).
func (s *Server) Object(t testing.TB, k string) []byte {
	t.Helper()
	out, err := s.Client().GetObject(context.Background(), &s3.GetObjectInput{Bucket: &s.Bucket, Key: &k})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Put stores b at key k, raw (what an attacker with the bucket could do).
func (s *Server) Put(t testing.TB, k string, b []byte) {
	t.Helper()
	if _, err := s.Client().PutObject(context.Background(), &s3.PutObjectInput{Bucket: &s.Bucket, Key: &k, Body: bytes.NewReader(b)}); err != nil {
		t.Fatal(err)
	}
}

func token(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
