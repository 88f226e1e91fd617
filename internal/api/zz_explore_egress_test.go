package api_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

func TestZZExploreEgress(t *testing.T) {
	ca := newTestCA(t)
	up := newUpstreams(t, ca, nil)
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{Network: daemon.NetworkConfig{
		Allow: []string{"allowed.test"}, Resolve: []string{"*.test=127.0.0.1"},
	}})
	_, sb := mustCreate(t, env, map[string]any{"templateID": "base"})
	for _, c := range []string{
		"id; grep Cap /proc/self/status; cat /proc/sys/kernel/yama/ptrace_scope; sleep 100 & sleep 0.2; cat /proc/$!/maps | head -3; python3 -c 'import sys; f=open(\"/proc/%d/mem\"%int(sys.argv[1]),\"rb\"); print(\"ok\")' $!",
		"echo 0 > /proc/sys/kernel/yama/ptrace_scope; echo rc=$?; cat /proc/sys/kernel/yama/ptrace_scope",
		"python3 -c 'import os; print(len(open(\"/proc/1/mem\",\"rb\").read(1)))'",
		"capsh --print 2>&1 | head",
		fmt.Sprintf("curl -sS -m 5 https://allowed.test:%d/; echo rc=$?", up.tlsPort),
		fmt.Sprintf(`python3 -c '
import socket, time
s = socket.create_connection(("allowed.test", %d))
s.sendall(b"G"); time.sleep(6)
s.sendall(b"ET / HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n")
print(s.recv(1000))'`, up.httpPort),
	} {
		res := sh(t, sb, "root", c)
		fmt.Fprintf(os.Stderr, "=== %s\nexit %d\n%s\n%s\n%q\n", c, res.ExitCode, res.Stdout, res.Stderr, res.SandboxEvents)
	}
}
