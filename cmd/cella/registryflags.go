package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/spf13/pflag"

	"github.com/cella-sandbox/cella/internal/image"
	"github.com/cella-sandbox/cella/internal/layerstore"
)

// registryFlags are how images are pulled, for `cella serve` and `cella
// template`; each reads CELLA_* too, so one environment serves both.
type registryFlags struct {
	mirrors  []string
	insecure []string
	maxLayer string
}

func registerRegistryFlags(f *pflag.FlagSet, r *registryFlags) {
	env := func(name string) []string {
		if v := strings.TrimSpace(os.Getenv(name)); v != "" {
			return strings.Split(v, ",")
		}
		return nil
	}
	f.StringSliceVar(&r.mirrors, "registry-mirror", env("CELLA_REGISTRY_MIRROR"),
		"REGISTRY=URL: pull REGISTRY's images from the mirror at URL first, as containerd's hosts.toml does (an http:// URL is plain HTTP); e.g. docker.io=http://127.0.0.1:5000 (repeatable) [CELLA_REGISTRY_MIRROR]")
	f.StringSliceVar(&r.insecure, "insecure-registry", env("CELLA_INSECURE_REGISTRY"),
		"HOST[:PORT] of a registry spoken to over plain HTTP (or HTTPS without certificate checks) (repeatable) [CELLA_INSECURE_REGISTRY]")
	f.StringVar(&r.maxLayer, "max-layer-size", envOr("CELLA_MAX_LAYER_SIZE", fmt.Sprintf("%dG", layerstore.DefaultMaxLayerSize>>30)),
		"the largest image layer a pull unpacks (compressed or not), e.g. 8G or 512M [CELLA_MAX_LAYER_SIZE]")
}

// config turns the flags into image.Hosts and a byte limit.
func (r registryFlags) config() (image.Hosts, int64, error) {
	var h image.Hosts
	for _, m := range r.mirrors {
		if err := h.AddMirror(strings.TrimSpace(m)); err != nil {
			return h, 0, fmt.Errorf("--registry-mirror: %w", err)
		}
	}
	for _, i := range r.insecure {
		h.Insecure = append(h.Insecure, strings.TrimSpace(i))
	}
	mib, err := parseMiB(r.maxLayer)
	if err != nil {
		return h, 0, fmt.Errorf("--max-layer-size: %w", err)
	}
	return h, mib << 20, nil
}

// registryAuth parses --registry-auth USER[:PASSWORD]; without a password
// it is read from stdin (so that it stays out of ps and shell history).
func registryAuth(v string) (authn.Authenticator, error) {
	if v == "" {
		return nil, nil
	}
	user, pass, ok := strings.Cut(v, ":")
	if !ok {
		fmt.Fprintf(os.Stderr, "password for %s (stdin): ", user)
		line, err := bufio.NewReader(os.Stdin).ReadString('\n')
		if err != nil && line == "" {
			return nil, fmt.Errorf("--registry-auth %s: read the password from stdin: %w", user, err)
		}
		pass = strings.TrimRight(line, "\r\n")
	}
	if user == "" {
		return nil, fmt.Errorf("--registry-auth: want USER[:PASSWORD]")
	}
	return authn.FromConfig(authn.AuthConfig{Username: user, Password: pass}), nil
}
