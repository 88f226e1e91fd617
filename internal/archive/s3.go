package archive

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// Bucket is where archive objects are kept: keys under a prefix of one
// bucket of an S3-compatible object store.
type Bucket interface {
	// Put stores what r yields under key, streaming (never the whole
	// object in memory).
	Put(ctx context.Context, key string, r io.Reader) error
	// Get reads the object at key; a missing one is errdefs.KindNotFound.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Delete removes the object at key; a missing one is no error.
	Delete(ctx context.Context, key string) error
	// String names the bucket and prefix for logs.
	String() string
}

// S3Config is an --archive s3://BUCKET/PREFIX with its endpoint.
type S3Config struct {
	// URL is s3://BUCKET[/PREFIX].
	URL string
	// Endpoint is an S3-compatible server's URL (then addressed
	// path-style); empty: AWS, from the usual configuration.
	Endpoint string
}

// ParseS3URL splits s3://BUCKET[/PREFIX] (the prefix without slashes at
// its ends).
func ParseS3URL(s string) (bucket, prefix string, err error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "s3" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", "", fmt.Errorf("%q: want s3://BUCKET[/PREFIX]", s)
	}
	return u.Host, strings.Trim(u.Path, "/"), nil
}

// partSize is the size of a multipart upload's parts (S3's minimum is 5
// MiB): an upload holds one part in memory.
const partSize = 8 << 20

// S3 is a Bucket on S3 or an S3-compatible server (aws-sdk-go-v2).
// Credentials, region and the rest come from the usual AWS environment
// and files (AWS_ACCESS_KEY_ID, AWS_PROFILE, ~/.aws/config, ...).
type S3 struct {
	c      *s3.Client
	bucket string
	prefix string
}

// NewS3 opens the bucket of cfg.
func NewS3(ctx context.Context, cfg S3Config) (*S3, error) {
	bucket, prefix, err := ParseS3URL(cfg.URL)
	if err != nil {
		return nil, err
	}
	ac, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("aws configuration: %w", err)
	}
	if ac.Region == "" {
		ac.Region = "us-east-1" // S3-compatible servers rarely care; the SDK insists
	}
	c := s3.NewFromConfig(ac, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
			o.UsePathStyle = true
		}
	})
	return &S3{c: c, bucket: bucket, prefix: prefix}, nil
}

func (b *S3) key(k string) string {
	if b.prefix == "" {
		return k
	}
	return b.prefix + "/" + k
}

func (b *S3) String() string { return "s3://" + b.bucket + "/" + b.prefix }

// Put uploads r: one PutObject when it fits a part, else a multipart
// upload of partSize parts (aborted on any failure, so no parts linger).
func (b *S3) Put(ctx context.Context, key string, r io.Reader) error {
	k := b.key(key)
	buf := make([]byte, partSize)
	n, err := io.ReadFull(r, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return fmt.Errorf("archive put %s: %w", k, err)
	}
	if n < partSize {
		_, err := b.c.PutObject(ctx, &s3.PutObjectInput{Bucket: &b.bucket, Key: &k, Body: bytes.NewReader(buf[:n]), ContentLength: aws.Int64(int64(n))})
		if err != nil {
			return fmt.Errorf("archive put %s: %w", k, err)
		}
		return nil
	}
	up, err := b.c.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &b.bucket, Key: &k})
	if err != nil {
		return fmt.Errorf("archive put %s: %w", k, err)
	}
	var parts []types.CompletedPart
	err = func() error {
		for num := int32(1); ; num++ {
			out, err := b.c.UploadPart(ctx, &s3.UploadPartInput{Bucket: &b.bucket, Key: &k, UploadId: up.UploadId,
				PartNumber: aws.Int32(num), Body: bytes.NewReader(buf[:n]), ContentLength: aws.Int64(int64(n))})
			if err != nil {
				return err
			}
			parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(num)})
			if n < partSize {
				return nil
			}
			n, err = io.ReadFull(r, buf)
			if errors.Is(err, io.EOF) {
				return nil // the previous part was the last, and full
			}
			if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
				return err
			}
		}
	}()
	if err == nil {
		_, err = b.c.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: &b.bucket, Key: &k, UploadId: up.UploadId,
			MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}})
	}
	if err != nil {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeoutAbort)
		defer cancel()
		_, _ = b.c.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: &b.bucket, Key: &k, UploadId: up.UploadId})
		return fmt.Errorf("archive put %s: %w", k, err)
	}
	return nil
}

// Get opens the object at key.
func (b *S3) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	k := b.key(key)
	out, err := b.c.GetObject(ctx, &s3.GetObjectInput{Bucket: &b.bucket, Key: &k})
	if err != nil {
		var nk *types.NoSuchKey
		if errors.As(err, &nk) {
			return nil, errdefs.NotFound("archive object %s not found", k)
		}
		return nil, fmt.Errorf("archive get %s: %w", k, err)
	}
	return out.Body, nil
}

// Delete removes the object at key.
func (b *S3) Delete(ctx context.Context, key string) error {
	k := b.key(key)
	if _, err := b.c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &b.bucket, Key: &k}); err != nil {
		return fmt.Errorf("archive delete %s: %w", k, err)
	}
	return nil
}
