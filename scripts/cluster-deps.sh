#!/usr/bin/env bash
# The real engines the cluster tests run: etcd, kube-apiserver (+ kubectl) and
# versitygw (S3), built from the pinned wrapper modules in tools/k8s/* (etcd's
# and kubernetes' own go.mods carry `replace` lines, so `go install` refuses
# them; the `replace` lines of a dependency are ignored).
#
# Binaries are cached in $CELLA_K8S_CACHE (default /var/cache/cella-k8s), one
# directory per engine version and Go version:
#   etcd-v3.6.16-go1.26.8/etcd
#   kube-v1.37.2-go1.26.8/{kube-apiserver,kubectl}
#   versitygw-v1.8.0-go1.26.8/versitygw
# A directory is complete only once its BUILDINFO exists (written last, after
# an atomic rename), so an interrupted build is redone, never half-used.
#
# The CPU is shared: every build runs `nice -n 10 go build -p 1`, one at a
# time (a flock on the cache serialises concurrent callers too).
#
#   scripts/cluster-deps.sh          build what is missing, print the paths
#   scripts/cluster-deps.sh paths    print the paths only (exit 1 if missing)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${CELLA_K8S_CACHE:-/var/cache/cella-k8s}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly
gover=$(go env GOVERSION)

modver() { go -C "$root/tools/k8s/$1" list -m -f '{{.Version}}' "$2"; }
etcd_v=$(modver etcd go.etcd.io/etcd/server/v3)
kube_v=$(modver kube k8s.io/kubernetes)
vgw_v=$(modver versitygw github.com/versity/versitygw)

etcd_dir=$cache/etcd-$etcd_v-$gover
kube_dir=$cache/kube-$kube_v-$gover
vgw_dir=$cache/versitygw-$vgw_v-$gover

print_paths() {
	echo "ETCD=$etcd_dir/etcd"
	echo "KUBE_APISERVER=$kube_dir/kube-apiserver"
	echo "KUBECTL=$kube_dir/kubectl"
	echo "VERSITYGW=$vgw_dir/versitygw"
}

if [ "${1:-}" = paths ]; then
	for d in "$etcd_dir" "$kube_dir" "$vgw_dir"; do
		[ -f "$d/BUILDINFO" ] || { echo "missing $d: run make cluster-deps" >&2; exit 1; }
	done
	print_paths
	exit 0
fi

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

# build DIR MODULE_DIR LDFLAGS NAME=PKG...
build() {
	local dir=$1 mod=$2 ld=$3; shift 3
	if [ -f "$dir/BUILDINFO" ]; then
		echo "cached: $dir" >&2
		return
	fi
	local tmp=$dir.tmp.$$
	rm -rf "$tmp" && mkdir -p "$tmp"
	local spec name pkg start
	for spec in "$@"; do
		name=${spec%%=*} pkg=${spec#*=}
		echo "building $name ($pkg) into $dir ..." >&2
		start=$(date +%s)
		(cd "$root/tools/k8s/$mod" && nice -n 10 go build -p 1 -trimpath -ldflags="$ld" -o "$tmp/$name" "$pkg")
		echo "$name: built in $(($(date +%s) - start)) s" | tee -a "$tmp/BUILDTIMES" >&2
	done
	(cd "$tmp" && sha256sum "${@%%=*}" >SHA256SUMS)
	{ echo "go=$gover"; echo "module=tools/k8s/$mod"; date -u +built=%FT%TZ; } >"$tmp/BUILDINFO.new"
	rm -rf "$dir"
	mv "$tmp" "$dir"
	mv "$dir/BUILDINFO.new" "$dir/BUILDINFO"
}

build "$etcd_dir" etcd "-s -w" etcd=go.etcd.io/etcd/server/v3

# Version stamping so /version and kubectl report the release, not v0.0.0-master.
minor=$(echo "$kube_v" | cut -d. -f2)
kube_ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kube_ld="$kube_ld -X $p.gitVersion=$kube_v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=2026-01-01T00:00:00Z"
done
build "$kube_dir" kube "$kube_ld" \
	kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
	kubectl=k8s.io/kubernetes/cmd/kubectl

build "$vgw_dir" versitygw "-s -w" versitygw=github.com/versity/versitygw/cmd/versitygw

print_paths
