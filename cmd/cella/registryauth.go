package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
)

// registryAuth parses --registry-auth USER[:PASSWORD], else
// CELLA_REGISTRY_AUTH; without a password it is read from stdin (so that it
// stays out of ps and shell history). The variable is read here, not as the
// flag's default, which --help would print.
func registryAuth(v string) (authn.Authenticator, error) {
	if v == "" {
		v = os.Getenv("CELLA_REGISTRY_AUTH")
	}
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
