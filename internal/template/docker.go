package template

import (
	"slices"

	"github.com/cella-sandbox/cella/internal/agentapi"
)

// DockerName is the builtin template whose sandboxes run a Docker engine
// of their own: `docker build`, `docker run` and `docker compose up` inside
// the sandbox, with nothing of the host's Docker (README "Docker inside a
// sandbox").
const DockerName = "docker"

// ServiceDocker is the service that makes the agent start dockerd when a
// sandbox of the template boots, and the daemon start its container with
// what an engine needs inside gVisor (runtime.Spec.ContainerEngine).
const ServiceDocker = agentapi.ServiceDocker

// The docker template's default limits. The engine itself (dockerd,
// containerd, a shim per container) holds about 300 MiB of resident memory
// as the agent counts it inside gVisor, so the daemon's default 512 MiB
// leaves too little for a build; images live on the sandbox's disk.
const (
	DockerMemoryMB = 2048
	DockerDiskMB   = 4096
)

// DockerRecipe is base plus Debian 12's Docker: the engine (docker.io, with
// containerd and runc; its legacy builder, as Debian's CLI has no buildx),
// Compose v1 (docker-compose: Debian 12 packages no Compose v2), iptables
// and iproute2 for the engine's bridge, and busybox-static, from which a
// sandbox can make a base image with no registry at all.
var DockerRecipe = Recipe{
	Suite: BaseRecipe.Suite,
	Packages: append(slices.Clone(BaseRecipe.Packages),
		"busybox-static", "containerd", "docker-compose", "docker.io", "iproute2", "iptables", "runc"),
	Setup: dockerSetup,
}

// dockerSetup makes Debian's Docker run inside gVisor, as gVisor's own
// Docker image does (images/basic/docker in its repository):
//   - iptables is the legacy one: the netstack implements iptables'
//     setsockopt interface, not nftables' netlink.
//   - the engine leaves iptables alone (--iptables=false): its rules need
//     netfilter features the netstack lacks; the agent adds the one rule
//     that matters, the bridge's SNAT to eth0 (internal/agent/docker.go).
//   - storage driver vfs: gVisor's overlay takes only a tmpfs upper, which
//     would keep every image in the sandbox's memory; vfs keeps them on
//     its disk (each layer a full copy: fine for the small images agents
//     build; the README says how to use overlay2 on a tmpfs instead).
//   - `docker compose` is a CLI plugin that runs Compose v1.
//   - `docker` and `docker-compose` wait (up to a minute) for the engine
//     the agent starts at boot, so a command right after create works.
//   - the sandbox user is in the docker group (it has passwordless sudo
//     anyway: the engine is the sandbox's, not the host's).
const dockerSetup = `
update-alternatives --set iptables /usr/sbin/iptables-legacy
update-alternatives --set ip6tables /usr/sbin/ip6tables-legacy
mkdir -p /etc/docker /usr/libexec/docker/cli-plugins /usr/local/lib/cella
cat > /etc/docker/daemon.json <<'END'
{
  "storage-driver": "vfs",
  "iptables": false,
  "ip6tables": false
}
END
cat > /usr/libexec/docker/cli-plugins/docker-compose <<'END'
#!/bin/sh
# docker compose: Debian 12 has Compose v1 only (docker-compose).
if [ "$1" = docker-cli-plugin-metadata ]; then
	echo '{"SchemaVersion":"0.1.0","Vendor":"cella","Version":"1.29.2","ShortDescription":"Docker Compose (Compose v1: docker-compose)"}'
	exit 0
fi
shift
exec docker-compose "$@"
END
cat > /usr/local/lib/cella/wait-dockerd <<'END'
# Sourced by the docker and docker-compose wrappers: while the dockerd the
# sandbox started at boot runs without its socket yet, wait (at most 60 s).
i=0
while [ ! -S /run/docker.sock ] && [ $i -lt 600 ] && pgrep -x dockerd >/dev/null; do
	sleep 0.1
	i=$((i + 1))
done
END
for c in docker docker-compose; do
	printf '#!/bin/sh\n. /usr/local/lib/cella/wait-dockerd\nexec /usr/bin/%s "$@"\n' "$c" > /usr/local/bin/$c
	chmod 755 /usr/local/bin/$c
done
chmod 755 /usr/libexec/docker/cli-plugins/docker-compose
usermod -aG docker user
`
