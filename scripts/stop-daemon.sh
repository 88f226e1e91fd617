#!/usr/bin/env bash
# Stop the daemon started by start-daemon.sh; it stops every sandbox first.
set -euo pipefail
data=${CELLA_DATA_DIR:-/var/lib/cella}
pidf="$data/daemon.pid"
[ -f "$pidf" ] || { echo "no daemon pid file in $data"; exit 0; }
pid=$(cat "$pidf")
if kill -TERM "$pid" 2>/dev/null; then
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
fi
rm -f "$pidf"
echo "cella daemon stopped"
