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
CHROMIUM=${CELLA_UI_CHROMIUM:-/usr/bin/chromium}
[ -x "$CHROMIUM" ] || { echo "compat/ui: $CHROMIUM not found (apt-get install chromium, or make deps)" >&2; exit 1; }
cd "$HERE"
lock_sum=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -d node_modules ] || [ "$(cat node_modules/.cella-lock-sha256 2>/dev/null)" != "$lock_sum" ]; then
  npm ci --no-audit --no-fund --loglevel=error
  echo "$lock_sum" > node_modules/.cella-lock-sha256
fi
DATA_DIR=$(mktemp -d /tmp/cella-ui-compat.XXXXXX)
SHOTS=$DATA_DIR/screenshots
PORT=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
"$ROOT/bin/cella" serve --listen "127.0.0.1:$PORT" --data-dir "$DATA_DIR" --cache-dir "$CACHE_DIR" >"$DATA_DIR/daemon.log" 2>&1 &
DAEMON_PID=$!
cleanup() {
  kill -TERM "$DAEMON_PID" 2>/dev/null || true
  for _ in $(seq 1 300); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$DAEMON_PID" 2>/dev/null || true
  if [ -d "$SHOTS" ]; then
    rm -rf "$HERE/screenshots" && cp -r "$SHOTS" "$HERE/screenshots"
    echo "compat/ui: screenshots in $HERE/screenshots" >&2
  fi
  if [ "${status:-1}" = 0 ]; then rm -rf "$DATA_DIR"; else echo "compat/ui: daemon log and screenshots kept in $DATA_DIR" >&2; tail -20 "$DATA_DIR/daemon.log" >&2; fi
}
trap cleanup EXIT
for _ in $(seq 1 600); do
  curl -fsS -o /dev/null "http://127.0.0.1:$PORT/health" 2>/dev/null && break
  kill -0 "$DAEMON_PID" 2>/dev/null || { echo "compat/ui: daemon died" >&2; exit 1; }
  sleep 0.1
done
export CELLA_UI_URL="http://127.0.0.1:$PORT" CELLA_UI_KEY=$(cat "$DATA_DIR/admin.key") CELLA_UI_SHOTS="$SHOTS" CELLA_UI_CHROMIUM="$CHROMIUM"
set +e
node --test --test-concurrency=1 --test-reporter=spec console.test.mjs desktop.test.mjs
status=$?
set -e
exit "$status"
