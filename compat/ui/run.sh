#!/usr/bin/env bash
# The web console (/ui) end to end in Debian's headless Chromium through
# playwright-core, with a daemon of its own (fresh data dir, free loopback
# port). Screenshots of each step land in $DATA_DIR/screenshots and are copied
# to compat/ui/screenshots/ (gitignored).
# Needs root, bin/cella + bin/runsc (make build), the base template and the
# chromium package (make deps).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE_DIR=${CELLA_CACHE_DIR:-/var/cache/cella}
COMPAT_NAME=compat/ui
# shellcheck source=../lib.sh
. "$HERE/../lib.sh"
CHROMIUM=${CELLA_UI_CHROMIUM:-/usr/bin/chromium}
[ -x "$CHROMIUM" ] || { echo "compat/ui: $CHROMIUM not found (apt-get install chromium, or make deps)" >&2; exit 1; }
cd "$HERE"
lock_sum=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -d node_modules ] || [ "$(cat node_modules/.cella-lock-sha256 2>/dev/null)" != "$lock_sum" ]; then
  npm ci --no-audit --no-fund --loglevel=error
  echo "$lock_sum" > node_modules/.cella-lock-sha256
fi
DATA_DIR=$(mktemp -d "${TMPDIR:-/tmp}/cella-ui-compat.XXXXXX")
SHOTS=$DATA_DIR/screenshots
PORT=$(free_port)
REGISTRY_PID=
DAEMON_PID=
cleanup() {
  if [ -n "$DAEMON_PID" ]; then
    kill -TERM "$DAEMON_PID" 2>/dev/null || true
    for _ in $(seq 1 300); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$DAEMON_PID" 2>/dev/null || true
  fi
  if [ -n "$REGISTRY_PID" ]; then kill "$REGISTRY_PID" 2>/dev/null || true; wait "$REGISTRY_PID" 2>/dev/null || true; fi
  if [ -d "$SHOTS" ]; then
    rm -rf "$HERE/screenshots" && cp -r "$SHOTS" "$HERE/screenshots"
    echo "compat/ui: screenshots in $HERE/screenshots" >&2
  fi
  if [ "${status:-1}" = 0 ]; then
    rm -rf "$DATA_DIR"
  else
    echo "compat/ui: daemon log and screenshots kept in $DATA_DIR" >&2
    tail -20 "$DATA_DIR/daemon.log" >&2 || true
    repeat_failures "$DATA_DIR/report-console.txt"
  fi
}
trap cleanup EXIT
# The image the build page builds FROM: the base template pushed to a
# registry on loopback as Docker Hub's stand-in:1, reached through the
# daemon's docker.io mirror, so nothing is pulled from anywhere but here.
start_registry "$DATA_DIR/registry" || exit 1
push_template "$ROOT/bin/cella" base "127.0.0.1:$REG_PORT/library/stand-in:1" "$CACHE_DIR" "$DATA_DIR/registry/push.log" || exit 1
IMAGE_REF=$(tail -n 1 "$DATA_DIR/registry/push.log") # REPO@sha256:...
"$ROOT/bin/cella" serve --listen "127.0.0.1:$PORT" --data-dir "$DATA_DIR" --cache-dir "$CACHE_DIR" \
  --registry-mirror "docker.io=http://127.0.0.1:$REG_PORT" >"$DATA_DIR/daemon.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 1 600); do
  curl -fsS -o /dev/null "http://127.0.0.1:$PORT/health" 2>/dev/null && break
  kill -0 "$DAEMON_PID" 2>/dev/null || { echo "compat/ui: daemon died" >&2; exit 1; }
  sleep 0.1
done
export CELLA_UI_URL="http://127.0.0.1:$PORT" CELLA_UI_KEY=$(cat "$DATA_DIR/admin.key") CELLA_UI_SHOTS="$SHOTS" CELLA_UI_CHROMIUM="$CHROMIUM" \
  CELLA_UI_CELLA="$ROOT/bin/cella" CELLA_UI_CACHE_DIR="$CACHE_DIR" CELLA_UI_IMAGE_DIGEST="${IMAGE_REF##*@}"
set +e
node --test --test-concurrency=1 --test-reporter=spec console.test.mjs desktop.test.mjs 2>&1 | tee "$DATA_DIR/report-console.txt"
status=${PIPESTATUS[0]}
set -e
exit "$status"
