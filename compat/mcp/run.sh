#!/usr/bin/env bash
# cella's MCP server against the official TypeScript MCP SDK, over stdio and
# streamable HTTP, with a daemon of its own (fresh data dir, free loopback port).
# Needs root, bin/cella + bin/runsc (make build) and the base template.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE_DIR=${CELLA_CACHE_DIR:-/var/cache/cella}
cd "$HERE"
lock_sum=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -d node_modules ] || [ "$(cat node_modules/.cella-lock-sha256 2>/dev/null)" != "$lock_sum" ]; then
  npm ci --no-audit --no-fund --loglevel=error
  echo "$lock_sum" > node_modules/.cella-lock-sha256
fi
DATA_DIR=$(mktemp -d /tmp/cella-mcp-compat.XXXXXX)
PORT=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
"$ROOT/bin/cella" serve --listen "127.0.0.1:$PORT" --data-dir "$DATA_DIR" --cache-dir "$CACHE_DIR" >"$DATA_DIR/daemon.log" 2>&1 &
DAEMON_PID=$!
cleanup() {
  kill -TERM "$DAEMON_PID" 2>/dev/null || true
  for _ in $(seq 1 300); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$DAEMON_PID" 2>/dev/null || true
  if [ "${status:-1}" = 0 ]; then rm -rf "$DATA_DIR"; else echo "compat/mcp: daemon log kept in $DATA_DIR/daemon.log" >&2; tail -20 "$DATA_DIR/daemon.log" >&2; fi
}
trap cleanup EXIT
for _ in $(seq 1 600); do
  curl -fsS -o /dev/null "http://127.0.0.1:$PORT/health" 2>/dev/null && break
  kill -0 "$DAEMON_PID" 2>/dev/null || { echo "compat/mcp: daemon died" >&2; exit 1; }
  sleep 0.1
done
export CELLA_MCP_URL="http://127.0.0.1:$PORT" CELLA_MCP_KEY=$(cat "$DATA_DIR/admin.key") CELLA_MCP_BIN="$ROOT/bin/cella"
set +e
node --test --test-concurrency=1 --test-reporter=spec mcp.test.mjs
status=$?
set -e
exit "$status"
