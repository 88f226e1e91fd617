#!/usr/bin/env bash
# E2B SDK conformance suite: runs the real e2b JS SDKs against a cella daemon
# of its own (fresh data dir, free loopback port), then stops it.
#
#   compat/e2b/run.sh                                   # everything
#   compat/e2b/run.sh --test-name-pattern='step 8'      # extra args go to node --test
#   CELLA_E2B_SKIP_TEMPLATES=1 compat/e2b/run.sh         # without the template build suite and its registry
#   CELLA_E2B_SUITES="desktop.test.mjs" compat/e2b/run.sh  # only these suites (space-separated)
#
# Needs: root, bin/cella + bin/runsc (make build), the base template in the
# cache dir (cella template ensure base code-interpreter-v1 docker), Node >= 20.11 with npm.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CELLA=${CELLA_BIN:-$ROOT/bin/cella}
CACHE_DIR=${CELLA_CACHE_DIR:-/var/cache/cella}
COMPAT_NAME=compat/e2b
# shellcheck source=../lib.sh
. "$HERE/../lib.sh"

[ "$(id -u)" = 0 ] || { echo "compat/e2b: must run as root (the daemon creates sandboxes)" >&2; exit 2; }
[ -x "$CELLA" ] || { echo "compat/e2b: $CELLA missing: run 'make build' first" >&2; exit 2; }
command -v node >/dev/null && command -v npm >/dev/null || { echo "compat/e2b: node and npm are required" >&2; exit 2; }

# Install the SDKs from the lockfile, only when needed.
cd "$HERE"
lock_sum=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -d node_modules ] || [ "$(cat node_modules/.cella-lock-sha256 2>/dev/null)" != "$lock_sum" ]; then
  npm ci --no-audit --no-fund --loglevel=error
  echo "$lock_sum" > node_modules/.cella-lock-sha256
fi

# A daemon of our own, run from a private copy of the binaries: the run uses
# the cella it started with (and the agent embedded in it) whatever a `make
# build` does meanwhile.
DATA_DIR=$(mktemp -d "${TMPDIR:-/tmp}/cella-e2b-compat.XXXXXX")
mkdir "$DATA_DIR/bin"
cp "$CELLA" "$DATA_DIR/bin/cella"
RUNSC=${CELLA_RUNSC:-$(dirname "$CELLA")/runsc}
if [ -x "$RUNSC" ]; then cp "$RUNSC" "$DATA_DIR/bin/runsc"; fi
PORT=$(free_port)
LOG=$DATA_DIR/daemon.log

# The template build suite's registry: Debian's docker-registry on loopback,
# holding the images the builds name (python:3.12-slim, debian:bookworm) as
# stand-ins made from the base template's layers; the daemon's docker.io
# mirror points at it, so no build pulls from anywhere but loopback.
REGISTRY_PID=
if [ "${CELLA_E2B_SKIP_TEMPLATES:-0}" != 1 ]; then
  start_registry "$DATA_DIR/registry" || { [ -n "${REGISTRY_PID:-}" ] && kill "$REGISTRY_PID" 2>/dev/null; exit 1; }
  for img in library/python:3.12-slim library/debian:bookworm; do
    push_template "$DATA_DIR/bin/cella" base "127.0.0.1:$REG_PORT/$img" "$CACHE_DIR" "$DATA_DIR/registry/push.log" ||
      { kill "$REGISTRY_PID"; exit 1; }
  done
  export CELLA_E2B_REGISTRY="127.0.0.1:$REG_PORT"
  SERVE_TEMPLATE_FLAGS=(--registry-mirror "docker.io=http://127.0.0.1:$REG_PORT" --build-ready-timeout 30s)
else
  SERVE_TEMPLATE_FLAGS=()
fi
# The egress ceiling is every .test name, and they all resolve to this
# host's loopback where network.test.mjs runs its upstream: no test traffic
# ever leaves the machine. Webhooks may post to this host's 127.0.0.1 only
# (events.test.mjs runs the receiver there).
"$DATA_DIR/bin/cella" serve --listen "127.0.0.1:$PORT" --data-dir "$DATA_DIR" --cache-dir "$CACHE_DIR" \
  --egress-allow '*.test' --egress-resolve '*.test=127.0.0.1' --webhook-allow 127.0.0.1 "${SERVE_TEMPLATE_FLAGS[@]}" >"$LOG" 2>&1 &
DAEMON_PID=$!
status=1

stop_daemon() {
  if kill -0 "$DAEMON_PID" 2>/dev/null; then
    kill -TERM "$DAEMON_PID" 2>/dev/null || true
    for _ in $(seq 1 300); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$DAEMON_PID" 2>/dev/null; then
      echo "compat/e2b: the daemon did not stop within 30 s of SIGTERM; killing it" >&2
      kill -KILL "$DAEMON_PID" 2>/dev/null || true
      status=1
    fi
  fi
  wait "$DAEMON_PID" 2>/dev/null || true
  if [ -n "$REGISTRY_PID" ]; then kill "$REGISTRY_PID" 2>/dev/null || true; wait "$REGISTRY_PID" 2>/dev/null || true; fi
  if [ "$status" != 0 ]; then
    echo "--- compat/e2b: last lines of the daemon log ($LOG) ---" >&2
    tail -n 60 "$LOG" >&2 || true
    echo "--- compat/e2b: data dir kept for inspection: $DATA_DIR (remove it when done) ---" >&2
    rm -rf "$DATA_DIR/bin"
    repeat_failures "$DATA_DIR"/report-*.txt
  else
    rm -rf "$DATA_DIR"
  fi
}
trap stop_daemon EXIT
trap 'exit 130' INT TERM

for _ in $(seq 1 300); do
  kill -0 "$DAEMON_PID" 2>/dev/null || { echo "compat/e2b: the daemon exited at start" >&2; exit 1; }
  code=$(node -e 'fetch(process.argv[1]).then(r=>console.log(r.status),()=>console.log(0))' "http://127.0.0.1:$PORT/health")
  [ "$code" = 204 ] && [ -s "$DATA_DIR/admin.key" ] && break
  sleep 0.2
done
[ "${code:-0}" = 204 ] || { echo "compat/e2b: the daemon did not answer GET /health with 204 within 60 s" >&2; exit 1; }

export CELLA_E2B_URL="http://127.0.0.1:$PORT"
CELLA_E2B_KEY=$(tr -d '\n' < "$DATA_DIR/admin.key")
export CELLA_E2B_KEY
echo "compat/e2b: daemon $CELLA_E2B_URL (pid $DAEMON_PID, data dir $DATA_DIR)"

TEMPLATE_TESTS=template.test.mjs
[ "${CELLA_E2B_SKIP_TEMPLATES:-0}" = 1 ] && TEMPLATE_TESTS=
set +e
# One suite a line, so that branches adding suites merge cleanly.
SUITES=(
  sdk.test.mjs
  code-interpreter.test.mjs
  network.test.mjs
  secrets.test.mjs
  quota.test.mjs
  volume.test.mjs
  git.test.mjs
  events.test.mjs
  fidelity.test.mjs
  cli.test.mjs
  desktop.test.mjs
  docker.test.mjs
)
if [ -n "${CELLA_E2B_SUITES:-}" ]; then
  # Only the named suites; the template suite only if it is named.
  SUITES=()
  chosen_templates=
  for f in $CELLA_E2B_SUITES; do
    if [ "$f" = template.test.mjs ]; then chosen_templates=$TEMPLATE_TESTS; else SUITES+=("$f"); fi
  done
  TEMPLATE_TESTS=$chosen_templates
fi
status=0
# Every test is a harness step() with a bound of its own; node applies
# --test-timeout to each file's whole run as well (a file is a test of its
# own), so this bounds a file, not a step: 120 s cut the desktop and docker
# suites short on a loaded machine while each of their steps was in time.
if [ "${#SUITES[@]}" -gt 0 ]; then
  node --test --test-concurrency=1 --test-timeout=1800000 --test-reporter=spec "$@" "${SUITES[@]}" 2>&1 | tee "$DATA_DIR/report-suites.txt"
  status=${PIPESTATUS[0]}
fi
# Template builds take minutes each on a loaded machine: their own, longer bound.
if [ -n "$TEMPLATE_TESTS" ]; then
  node --test --test-concurrency=1 --test-timeout=7200000 --test-reporter=spec "$@" $TEMPLATE_TESTS 2>&1 | tee "$DATA_DIR/report-templates.txt"
  tstatus=${PIPESTATUS[0]}
  [ "$status" = 0 ] && status=$tstatus
fi
set -e
exit "$status"
