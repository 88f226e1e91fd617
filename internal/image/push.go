package image

import (
	"context"
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Push writes img to the registry reference ref (mirrors are for pulls
// only) and returns the reference by digest. progress, if not nil,
// receives go-containerregistry's byte counts as the layers upload.
func Push(ctx context.Context, ref string, img v1.Image, o Options, progress chan<- v1.Update) (string, error) {
	r, err := parseRef(ref, o.Hosts)
	if err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	opts := remoteOptions(ctx, o, o.Auth)
	if progress != nil {
		opts = append(opts, remote.WithProgress(progress))
	}
	if err := remote.Write(r, img, opts...); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, explainRemote(r, err))
	}
	d, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	return r.Context().Digest(d.String()).String(), nil
}
