#!/usr/bin/env bash
# Start `cella serve` in the background unless one already answers.
set -euo pipefail
cd "$(dirname "$0")/.."
listen=${1:-127.0.0.1:3000}
data=${CELLA_DATA_DIR:-/var/lib/cella}
if curl -fsS -o /dev/null "http://$listen/health" 2>/dev/null; then
  echo "cella daemon already running on $listen"
  exit 0
fi
mkdir -p "$data"
log="$data/daemon.log"
echo "starting cella daemon on $listen (log: $log)"
nohup "$PWD/bin/cella" serve --listen "$listen" --data-dir "$data" >>"$log" 2>&1 &
echo $! > "$data/daemon.pid"
for _ in $(seq 1 600); do
  if curl -fsS -o /dev/null "http://$listen/health" 2>/dev/null; then
    echo "cella daemon is up (pid $(cat "$data/daemon.pid")); admin key in $data/admin.key"
    exit 0
  fi
  if ! kill -0 "$(cat "$data/daemon.pid")" 2>/dev/null; then
    echo "cella daemon failed to start; last log lines:" >&2
    tail -20 "$log" >&2
    exit 1
  fi
  sleep 0.2
done
echo "cella daemon did not answer on $listen within 120 s" >&2
exit 1
