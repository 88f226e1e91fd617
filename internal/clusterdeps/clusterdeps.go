// Package clusterdeps finds the real engines the cluster and archive tests
// run (etcd, kube-apiserver, kubectl, versitygw), which `make cluster-deps`
// builds from the pinned wrapper modules in tools/k8s into
// /var/cache/cella-k8s; scripts/cluster-deps.sh paths names them. A leaf, so
// that test helpers of any floor (clustertest, archive/s3test) can look the
// engines up without importing each other.
package clusterdeps

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// EnvGate is the variable that enables the tests that need the engines.
const EnvGate = "CELLA_TEST_CLUSTER"

// Binaries are the engines' paths.
type Binaries struct {
	Etcd, KubeAPIServer, Kubectl, Versitygw string
}

// Enabled reports whether the tests that need the engines are on.
func Enabled() bool { return os.Getenv(EnvGate) == "1" }

// Lookup finds the engines through scripts/cluster-deps.sh paths.
func Lookup() (Binaries, error) {
	root, err := repoRoot()
	if err != nil {
		return Binaries{}, err
	}
	out, err := exec.Command(filepath.Join(root, "scripts", "cluster-deps.sh"), "paths").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return Binaries{}, fmt.Errorf("the engines are not built: run make cluster-deps (%s)", strings.TrimSpace(string(ee.Stderr)))
		}
		return Binaries{}, fmt.Errorf("scripts/cluster-deps.sh paths: %w", err)
	}
	var b Binaries
	for _, line := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		switch k {
		case "ETCD":
			b.Etcd = v
		case "KUBE_APISERVER":
			b.KubeAPIServer = v
		case "KUBECTL":
			b.Kubectl = v
		case "VERSITYGW":
			b.Versitygw = v
		}
	}
	if b.Etcd == "" || b.KubeAPIServer == "" {
		return b, fmt.Errorf("scripts/cluster-deps.sh paths printed no etcd/kube-apiserver:\n%s", out)
	}
	return b, nil
}

// repoRoot finds the module root from the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/cella-sandbox/cella\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the cella module root")
		}
		dir = parent
	}
}
