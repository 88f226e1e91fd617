#!/usr/bin/env bash
# Builds runsc from the pinned gVisor module (tools/runsc/go.mod) with its
# seccomp programs precompiled (tools/runsc/seccomp/*.go.in, written by
# tools/runsc/seccompgen): the module is copied (hard links, no space) to a
# temporary directory, its two filter_precompiled.go files are replaced by
# ours, and `go build` uses the copy through a `replace` in a temporary
# go.mod. Everything else of the module is the verified download itself.
#
# It must be a static build (CGO_ENABLED=0): a cgo build dies at sandbox
# boot (runtime-notes §1b), and the programs are those of a static build.
#
#   scripts/build-runsc.sh OUT
set -euo pipefail

out=$(realpath -m "$1")
go=${GO:-go}
root=$(cd "$(dirname "$0")/.." && pwd)
mod=$root/tools/runsc
export CGO_ENABLED=0 GOFLAGS=-mod=readonly

version=$($go -C "$mod" list -m -f '{{.Version}}' gvisor.dev/gvisor)
for f in boot gofer; do
	have=$(sed -n '2s|^// gVisor ||p' "$mod/seccomp/${f}_filter_precompiled.go.in")
	if [ "$have" != "$version" ]; then
		echo "build-runsc: tools/runsc/seccomp/${f}_filter_precompiled.go.in is for gVisor $have, go.mod pins $version: run make seccomp" >&2
		exit 1
	fi
done
$go -C "$mod" mod download gvisor.dev/gvisor
src=$($go -C "$mod" list -m -f '{{.Dir}}' gvisor.dev/gvisor)

work=$(mktemp -d "${TMPDIR:-/tmp}/cella-runsc-build.XXXXXX")
# Only the directories are made writable for the removal: the files are
# links to the module cache's, whose modes a chmod would change.
trap 'find "$work" -type d -exec chmod u+w {} + 2>/dev/null; rm -rf "$work"' EXIT
# Hard links where the module cache is on the same filesystem, a copy
# otherwise (a failed cp -al leaves the tree it made: start again from
# nothing); the replaced files are new files, never writes through a link.
if ! cp -al "$src" "$work/gvisor" 2>/dev/null; then
	find "$work/gvisor" -type d -exec chmod u+w {} + 2>/dev/null || true
	rm -rf "$work/gvisor"
	cp -a "$src" "$work/gvisor"
fi
test -f "$work/gvisor/go.mod" || { echo "build-runsc: the copy of $src lacks its go.mod" >&2; exit 1; }
for pair in boot:runsc/boot/filter gofer:runsc/fsgofer/filter; do
	f=${pair%%:*} dir=$work/gvisor/${pair#*:}
	chmod u+w "$dir"
	rm -f "$dir/filter_precompiled.go"
	cp "$mod/seccomp/${f}_filter_precompiled.go.in" "$dir/filter_precompiled.go"
done
cp "$mod/go.mod" "$mod/go.sum" "$work/"
echo "replace gvisor.dev/gvisor => $work/gvisor" >>"$work/go.mod"
$go -C "$mod" build -modfile="$work/go.mod" -trimpath -ldflags='-s -w' -o "$out" gvisor.dev/gvisor/runsc
