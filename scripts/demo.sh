#!/usr/bin/env bash
# The demo of `make run`: one sandbox, Python in it, an escape attempt that
# fails with its explanation, and the sandbox removed.
set -euo pipefail
cd "$(dirname "$0")/.."
cella=$PWD/bin/cella
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

if ! $cella template ls --local 2>/dev/null | grep -q '^base '; then
  say "building the base template from Debian packages (first run only, about a minute)"
  $cella template ensure base
fi

say "cella run -- python3 -c 'print(6*7)'   (a throwaway gVisor sandbox)"
$cella run -- python3 -c 'print(6*7)'

say "create a sandbox"
id=$($cella create --timeout 5m --metadata demo=true)
echo "$id"
trap '$cella kill "$id" >/dev/null 2>&1 || true' EXIT

say "run Python in it"
$cella exec "$id" -- python3 -c 'import platform, os; print("kernel:", platform.release(), "| user:", os.getuid(), "| cwd:", os.getcwd())'

secret=/tmp/cella-demo-host-secret
echo "host secret $(date +%s)" > "$secret"
say "escape attempts (each must fail)"
echo "\$ cat $secret        # a file on the host, read as root inside the sandbox"
$cella exec --user root "$id" -- cat "$secret" || echo "-> refused: the sandbox sees only its template and its own layer, not the host's files"
echo "\$ curl http://127.0.0.1:3000/health   # the cella API on the host's loopback"
$cella exec "$id" -- curl -sS --max-time 3 http://127.0.0.1:3000/health || echo "-> refused: the sandbox's loopback is its own; it has no route to the host"
echo "\$ curl http://example.com/   # the internet: no egress unless the operator allows it (cella serve --egress-allow)"
$cella exec "$id" -- curl -sS --max-time 5 http://example.com/ || echo "-> refused: cella's egress proxy answers the sandbox's DNS and allows nothing by default; the block is explained above and in the audit log"
echo "\$ ps aux   # what processes can it see?"
$cella exec "$id" -- ps -eo pid,user,comm
rm -f "$secret"

say "kill it"
$cella kill "$id"
trap - EXIT
$cella ls
say "done. The daemon keeps running: try 'bin/cella run -- uname -a'; stop it with 'make stop'."
