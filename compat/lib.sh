# Shared by the compat suites' run.sh scripts (sourced, never run): a free
# loopback port, the loopback registry that stands in for Docker Hub, and
# the failing-test summary a CI log's tail shows.

# free_port prints a TCP port on 127.0.0.1 that nothing listens on now.
free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }

# start_registry DIR starts Debian's docker-registry on a free loopback port
# with its storage, config and log under DIR, and waits until it answers
# GET /v2/. Sets REG_PORT and REGISTRY_PID; the caller stops it.
start_registry() {
  local dir=$1 who=${COMPAT_NAME:-compat}
  command -v docker-registry >/dev/null ||
    { echo "$who: docker-registry is missing (apt-get install docker-registry; make deps does)" >&2; return 2; }
  REG_PORT=$(free_port)
  mkdir -p "$dir"
  printf 'version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:%s\n' \
    "$dir/data" "$REG_PORT" > "$dir/config.yml"
  docker-registry serve "$dir/config.yml" >"$dir/registry.log" 2>&1 &
  REGISTRY_PID=$!
  for _ in $(seq 1 150); do
    [ "$(node -e 'fetch(process.argv[1]).then(r=>console.log(r.status),()=>console.log(0))' "http://127.0.0.1:$REG_PORT/v2/")" = 200 ] && return 0
    kill -0 "$REGISTRY_PID" 2>/dev/null || break
    sleep 0.2
  done
  echo "$who: the registry on 127.0.0.1:$REG_PORT did not answer GET /v2/:" >&2
  tail -n 20 "$dir/registry.log" >&2
  return 1
}

# push_template CELLA TEMPLATE REF CACHE_DIR LOG pushes a cached template to
# the loopback registry as REF; the last line of LOG is REPO@sha256:....
push_template() {
  local cella=$1 template=$2 ref=$3 cache=$4 log=$5 who=${COMPAT_NAME:-compat}
  "$cella" template push "$template" "$ref" --cache-dir "$cache" --insecure-registry "127.0.0.1:$REG_PORT" >"$log" 2>&1 ||
    { echo "$who: pushing the stand-in image $ref failed:" >&2; tail -n 20 "$log" >&2; return 1; }
}

# repeat_failures REPORT... prints each node --test spec report's own
# "failing tests" summary again, so that it is the last thing in the log.
repeat_failures() {
  local who=${COMPAT_NAME:-compat} out
  for out in "$@"; do
    [ -f "$out" ] && grep -q 'failing tests:' "$out" || continue
    echo "--- $who: failing tests of $(basename "$out" .txt) (repeated from above) ---" >&2
    sed -n '/failing tests:/,$p' "$out" | head -n 200 >&2
  done
}
