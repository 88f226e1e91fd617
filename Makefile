# cella — build, run and test. Everything runs as root on Debian 12.
SHELL := /bin/bash
GO ?= go
BIN := bin
APT_PACKAGES := debootstrap debian-archive-keyring crun bubblewrap hyperfine ca-certificates curl iproute2 tar chromium docker-registry python3-ipython python3-pandas python3-matplotlib esbuild r-base-core r-cran-irkernel
DATA_DIR ?= /var/lib/cella
CACHE_DIR ?= /var/cache/cella
LISTEN ?= 127.0.0.1:3000
export CELLA_DATA_DIR := $(DATA_DIR)
export CELLA_CACHE_DIR := $(CACHE_DIR)

.PHONY: all deps build ui run test bench soak clean stop proto api seccomp cluster-deps test-cluster

all: build

# Debian packages cella drives (debootstrap builds templates, crun is the
# namespaces runtime, docker-registry is the registry the image tests and
# `cella bench template` start on loopback themselves). Installed only when
# missing. docker-registry's package enables a system service on port 5000:
# it is stopped and disabled right after the install, nothing of cella uses it.
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  case " $$missing " in *" docker-registry "*) \
	    systemctl disable --now docker-registry.service >/dev/null 2>&1 || systemctl --root=/ disable docker-registry.service >/dev/null 2>&1 || true; \
	    update-rc.d docker-registry disable >/dev/null 2>&1 || true; \
	    if pgrep -u docker-registry -x docker-registry >/dev/null; then service docker-registry stop >/dev/null 2>&1 || true; fi;; \
	  esac; \
	fi

build: $(BIN)/cella $(BIN)/runsc

# The web console (ui/, vanilla JS + xterm.js, bundled by esbuild) is built
# into internal/ui/dist, which the daemon embeds. The built files are
# committed, so `go build ./...` works without npm; this rebuilds them when
# ui/ changes (npm ci only when node_modules is missing or its stamp,
# node_modules/.cella-lock-sha256, does not hold the lockfile's sha256).
# Without npm the committed build is used as it is.
UI_DIST := internal/ui/dist/app.js
ui: $(UI_DIST)

$(UI_DIST): $(shell find ui/src -type f) ui/build.mjs ui/package.json ui/package-lock.json
	@if ! command -v npm >/dev/null; then echo "npm not found: using the committed console build in internal/ui/dist"; touch $@; exit 0; fi; \
	cd ui && lock=$$(sha256sum package-lock.json | cut -d' ' -f1); \
	if [ ! -d node_modules ] || [ "$$(cat node_modules/.cella-lock-sha256 2>/dev/null)" != "$$lock" ]; then \
	  npm ci --no-audit --no-fund --loglevel=error && echo "$$lock" > node_modules/.cella-lock-sha256; \
	fi && npm run --silent build
	@touch $@

# The sandbox agent (cmd/cella-agent) is a small binary of its own, embedded
# in cella (internal/agentbin), which writes it out for its sandboxes: one
# file to install, and a sandbox pages in only the agent. Built first, so
# every entry point (build, run, test, bench, soak) gets a cella that holds it.
AGENT_EMBED := internal/agentbin/dist/cella-agent
GO_SOURCES := $(shell find cmd internal -name '*.go' -o -path '*/codeinterp/drivers/*')

$(AGENT_EMBED): $(GO_SOURCES) go.mod go.sum
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $@ ./cmd/cella-agent

$(BIN)/cella: $(GO_SOURCES) $(AGENT_EMBED) internal/apiwire/openapi.yaml internal/apiwire/openapi.json go.mod go.sum $(UI_DIST)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $@ ./cmd/cella

# gVisor is a pinned Go module (tools/runsc/go.mod). It must be built with
# CGO_ENABLED=0: a cgo build dies at sandbox boot (runtime-notes §1b). It is
# built with its seccomp programs precompiled (tools/runsc/seccomp, as
# gVisor's Bazel build does; `make seccomp` writes them again after a bump
# of the module): a start, restore or fork then skips ~20 ms of compiling
# them on its critical path.
RUNSC_SECCOMP := tools/runsc/seccomp/boot_filter_precompiled.go.in tools/runsc/seccomp/gofer_filter_precompiled.go.in
$(BIN)/runsc: tools/runsc/go.mod tools/runsc/go.sum $(RUNSC_SECCOMP) scripts/build-runsc.sh
	GO=$(GO) scripts/build-runsc.sh $@

# The generator runs as PID 1 of a PID namespace of its own, as the sentry
# and the gofer do: some rules hold the process's own PID (needs root).
seccomp:
	cd tools/runsc && gen=$$(mktemp -d) && trap 'rm -rf "$$gen"' EXIT && \
	  CGO_ENABLED=0 $(GO) build -o "$$gen/seccompgen" ./seccompgen && \
	  unshare --pid --fork "$$gen/seccompgen" boot >"$$gen/boot" && \
	  unshare --pid --fork "$$gen/seccompgen" gofer >"$$gen/gofer" && \
	  mv "$$gen/boot" seccomp/boot_filter_precompiled.go.in && \
	  mv "$$gen/gofer" seccomp/gofer_filter_precompiled.go.in

# Regenerate the Connect code from proto/ (needs protoc; the output is committed).
proto:
	PATH=$$($(GO) env GOPATH)/bin:$$PATH; \
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.11; \
	$(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.19.1; \
	protoc -I proto -I /usr/include --go_out=. --go_opt=module=github.com/cella-sandbox/cella \
	  --connect-go_out=. --connect-go_opt=module=github.com/cella-sandbox/cella \
	  proto/process/process.proto proto/filesystem/filesystem.proto

# Regenerate the REST API's Go types (internal/apiwire/apiwire.gen.go) and the served JSON (openapi.json) from its
# OpenAPI document with oapi-codegen, pinned in tools/oapi-codegen/go.mod (the
# output is committed; TestGeneratedUpToDate fails when it is stale).
api:
	$(GO) generate ./internal/apiwire

# Build, start the daemon (if it is not already up), build the base template
# on first use, and run the demo.
run: deps build
	@scripts/start-daemon.sh $(LISTEN)
	@CELLA_URL=http://$(LISTEN) scripts/demo.sh

stop:
	@scripts/stop-daemon.sh

test: deps build
	scripts/test.sh

# The real engines of the cluster tests (etcd, kube-apiserver, kubectl,
# versitygw), built from the pinned wrapper modules in tools/k8s into
# /var/cache/cella-k8s/<engine>-<version>-<go version>/ and reused from there
# (cold: about 20 minutes at `nice -n 10 go build -p 1`; warm: instant).
cluster-deps:
	scripts/cluster-deps.sh

# The tests that run against the real control plane (CELLA_TEST_CLUSTER=1;
# they skip in `make test`), one package at a time: each starts its own
# control plane, and the CPU is shared.
# TestCluster runs compat/e2b's SDK suite through the gateways: its SDKs
# are installed from the lockfile when missing or stale (as run.sh does).
test-cluster: cluster-deps build
	cd compat/e2b && sum=$$(sha256sum package-lock.json | cut -d' ' -f1) && \
	  if [ "$$(cat node_modules/.cella-lock-sha256 2>/dev/null)" != "$$sum" ]; then \
	    npm ci --no-audit --no-fund --loglevel=error && echo "$$sum" > node_modules/.cella-lock-sha256; fi
	CELLA_TEST_CLUSTER=1 CELLA_TEST_BIN=$$PWD/$(BIN)/cella CELLA_TEST_RUNSC=$$PWD/$(BIN)/runsc \
	  $(GO) test -p 1 -count=1 -timeout 30m ./internal/cluster/... ./internal/clustertest/... ./internal/gateway/... ./internal/drain/... ./internal/archive/...
	CELLA_TEST_CLUSTER=1 CELLA_TEST_BIN=$$PWD/$(BIN)/cella CELLA_TEST_RUNSC=$$PWD/$(BIN)/runsc \
	  $(GO) test -count=1 -timeout 20m -run TestArchiveS3 ./internal/daemon/conformance/

# Benchmarks start their own daemons; not part of CI.
bench: deps build
	$(BIN)/cella bench all

# 50 agents × 100 commands on a `cella serve` child, then kill -9 of it
# mid-load and a restart: zero errors and nothing leaked, or it fails.
# SOAK_FLAGS=--runtime=namespaces (or --smoke) to change it.
soak: deps build
	$(BIN)/cella bench soak $(SOAK_FLAGS)

clean:
	rm -rf $(BIN) $(AGENT_EMBED)
