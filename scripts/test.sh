#!/usr/bin/env bash
# `make test`: the whole suite, as root, against real gVisor and crun
# sandboxes. The base template is built once per machine and cached.
set -euo pipefail
cd "$(dirname "$0")/.."
export CELLA_TEST_BIN=$PWD/bin/cella
export CELLA_TEST_RUNSC=$PWD/bin/runsc
# Builtin templates are built once per machine (minutes on a new one), before
# any test asks for them: an SDK create would time out waiting for a build.
./bin/cella template ensure base code-interpreter-v1 desktop docker
go test -count=1 -timeout 25m ./...
compat/mcp/run.sh    # MCP: the official TypeScript MCP SDK over stdio and streamable HTTP
compat/e2b/run.sh    # E2B SDK conformance: real e2b JS SDKs against a daemon of its own
compat/ui/run.sh     # web console: headless Chromium (playwright-core) logs in, creates, types, charts, snapshots, pools, keys, secrets, volumes
# A smoke run of every benchmark (a few seconds each: it keeps them working;
# the measurements are `make bench`).
./bin/cella bench all --smoke
./bin/cella bench state --smoke
./bin/cella bench desktop --smoke                      # one desktop create and its screenshots
./bin/cella bench soak --smoke                        # ~5 s: load, kill -9, restart, leak checks
./bin/cella bench soak --smoke --runtime namespaces   # ~2 s
