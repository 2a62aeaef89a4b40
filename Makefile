# mongobouncer build and test entry points. `make test` is what CI runs
# (through .ci/run) and must work on a fresh machine: it builds everything
# the tests need first.
GO        ?= go
BIN       := $(CURDIR)/bin
DEVMONGO  := $(BIN)/devmongo
FERRETDB  := $(BIN)/ferretdb
PKGS      := ./...
# Tests find the embedded FerretDB server and the CMAP suite through these.
export MONGOBOUNCER_DEVMONGO := $(DEVMONGO)
# ... and FerretDB's own command, the upstream with authentication.
export MONGOBOUNCER_FERRETDB := $(FERRETDB)

.PHONY: all build image image-tools devmongo ferretdb node-tools python-tools c-tools browser-tools haproxy test vet fmt-check bench fuzz demo clean

all: build

build: devmongo
	$(GO) build -o $(BIN)/mongobouncer ./cmd/mongobouncer
	$(GO) build -o $(BIN)/mongobouncer-bench ./cmd/mongobouncer-bench
	$(GO) build -o $(BIN)/mongobouncer-demo ./cmd/mongobouncer-demo

# demo runs mongobouncer for real: embedded FerretDB upstream, the pooler
# with a pool of 10, and HAProxy beside it when installed (`make haproxy`;
# not a prerequisite, so that the demo stays about a minute on a fresh
# machine), and the same driver workload (80 % find by _id, 20 % insert)
# direct, through mongobouncer and through HAProxy, at 100 and 10 clients.
demo: build
	$(BIN)/mongobouncer-demo -mongobouncer $(BIN)/mongobouncer

# image builds the container image (README.md, "Deploy") with buildah,
# without a daemon and without pulling anything: a static binary
# (CGO_ENABLED=0, -trimpath, stripped) built here, with the host's CA
# certificates, deploy/image/rootfs (passwd and group with the non-root user
# 65532, the default configuration) and an empty /tmp (all readable by
# every user, writable by root only but for /tmp), assembled in IMAGE_CTX
# (bin/image) and put FROM scratch by deploy/image/Dockerfile.prebuilt (the
# Dockerfile at the root builds the same image from source with Docker or
# Podman). It is then also written as an OCI archive, IMAGE_ARCHIVE, for
# `podman load` or a registry (`skopeo copy oci-archive:...`). VERSION (the
# latest tag, when there is one; else the source's default) and REVISION
# (the commit) go into the binary's --version and the image's labels.
# BUILDAH_FLAGS: vfs storage works everywhere, in containers too (overlay
# is faster where the kernel allows it).
IMAGE         ?= mongobouncer:latest
IMAGE_ARCHIVE ?= $(BIN)/mongobouncer-image.tar
BUILDAH_FLAGS ?= --storage-driver vfs
VERSION       ?= $(shell git describe --tags --dirty 2>/dev/null)
REVISION      ?= $(shell git rev-parse HEAD 2>/dev/null)
IMAGE_CTX     ?= $(BIN)/image
image: image-tools
	rm -rf $(IMAGE_CTX)
	mkdir -p $(IMAGE_CTX)/rootfs/tmp $(IMAGE_CTX)/rootfs/etc/ssl/certs
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(if $(VERSION),-X main.version=$(VERSION)) $(if $(REVISION),-X main.revision=$(REVISION))" -o $(IMAGE_CTX)/rootfs/mongobouncer ./cmd/mongobouncer
	cp -R deploy/image/rootfs/. $(IMAGE_CTX)/rootfs/
	cp /etc/ssl/certs/ca-certificates.crt $(IMAGE_CTX)/rootfs/etc/ssl/certs/
	chmod -R a+rX,go-w $(IMAGE_CTX)/rootfs
	chmod 1777 $(IMAGE_CTX)/rootfs/tmp
	buildah $(BUILDAH_FLAGS) bud --isolation chroot --layers=false \
		--build-arg VERSION="$$($(IMAGE_CTX)/rootfs/mongobouncer --version | cut -d' ' -f2)" \
		--build-arg REVISION="$(REVISION)" \
		-f deploy/image/Dockerfile.prebuilt -t $(IMAGE) $(IMAGE_CTX)
	rm -f $(IMAGE_ARCHIVE)
	buildah $(BUILDAH_FLAGS) push $(IMAGE) oci-archive:$(IMAGE_ARCHIVE)

# image-tools installs Debian's buildah, which `make image` and its test
# (deploy/image) use, and ca-certificates, which the image copies. It needs
# root for apt-get; without root it only says what to run, and the test
# skips (it fails under CI, which runs as root).
image-tools:
	@if command -v buildah >/dev/null 2>&1 && [ -f /etc/ssl/certs/ca-certificates.crt ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah ca-certificates; \
	else echo "image-tools: as root, run: apt-get install buildah ca-certificates"; fi

# devmongo is a separate module (tools/devmongo) so FerretDB and its SQLite
# backend never enter the main go.mod.
devmongo: $(DEVMONGO)
$(DEVMONGO): $(shell find tools/devmongo -name '*.go' -o -name go.mod -o -name go.sum 2>/dev/null)
	cd tools/devmongo && $(GO) build -o $(DEVMONGO) .

# ferretdb is FerretDB's own command (cmd/ferretdb, the version
# tools/devmongo pins), the only FerretDB that offers SCRAM authentication:
# the upstream of the tests of mongobouncer's service-user login. The
# published module cannot be built as it is (see tools/ferretdb/build.sh).
ferretdb: $(FERRETDB)
$(FERRETDB): tools/ferretdb/build.sh tools/ferretdb/go.mod tools/ferretdb/go.sum tools/devmongo/go.mod
	GO=$(GO) sh tools/ferretdb/build.sh $(FERRETDB)

# node-tools installs mongosh (pinned in tools/node/package-lock.json) for
# the end-to-end tests. The stamp lives inside node_modules, so a missing
# node_modules or a changed lock reinstalls; otherwise nothing runs.
# --ignore-scripts: mongosh needs none of its optional native addons, and
# skipping them needs no compiler on a fresh machine.
NODE_TOOLS := tools/node/node_modules/.mongobouncer-installed
node-tools: $(NODE_TOOLS)
$(NODE_TOOLS): tools/node/package.json tools/node/package-lock.json
	npm ci --prefix tools/node --ignore-scripts --no-audit --no-fund
	touch $@

# python-tools installs pymongo (Debian's python3-pymongo, for
# /usr/bin/python3) for the end-to-end tests. It needs root for apt-get;
# without root it only says what to run, and the pymongo test skips (it
# fails under CI, which runs as root).
python-tools:
	@if /usr/bin/python3 -c 'import pymongo' 2>/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pymongo; \
	else echo "python-tools: as root, run: apt-get install python3-pymongo"; fi

# c-tools installs Debian's libmongoc-dev (with a C compiler and
# pkg-config) for the end-to-end test that compiles a tiny libmongoc
# client (internal/e2e/testdata/mongoc_login.c), and the openssl command,
# which internal/proxy's test of X.509 subject names compares with. It
# needs root for apt-get; without root it only says what to run, and the
# tests skip (they fail under CI, which runs as root).
c-tools:
	@if command -v cc >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1 && pkg-config --exists libmongoc-1.0 2>/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev pkg-config libmongoc-dev openssl; \
	else echo "c-tools: as root, run: apt-get install gcc libc6-dev pkg-config libmongoc-dev openssl"; fi

# browser-tools installs Debian's chromium for the status-page test
# (internal/admin). It needs root for apt-get; without root it only says
# what to run, and the test skips (it fails under CI, which runs as root).
browser-tools:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	else echo "browser-tools: as root, run: apt-get install chromium"; fi

# haproxy installs Debian's HAProxy, the reference the load tool
# (`mongobouncer-bench -ref haproxy`) and `make demo` measure mongobouncer
# against: a plain TCP relay with one upstream connection per client. It
# needs root for apt-get; without root it only says what to run, and the
# HAProxy column is skipped with a message (its tests skip too).
haproxy:
	@if command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy; \
	else echo "haproxy: as root, run: apt-get install haproxy"; fi

# vet also checks a build without Linux (the event loop's stubs in
# *_other.go), which no test on this machine compiles.
vet:
	$(GO) vet $(PKGS)
	GOOS=darwin $(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# tools/deploytest is a module of its own (k8s.io/api stays out of the main
# go.mod): it decodes deploy/kubernetes strictly and checks it against the
# binary it builds.
# The end-to-end tests run each I/O model (a goroutine per client, the event
# loop on epoll and on io_uring) as subtests of their own. The allocation
# test skips under -race (counts mean nothing there), so it runs once more
# without it. -timeout bounds one package: the end-to-end package takes about
# 7 minutes on a quiet 2-core machine, so 15 leaves room for a busy one
# while still ending a hung test well inside CI's limit.
test: devmongo ferretdb node-tools python-tools c-tools browser-tools haproxy image-tools fmt-check vet
	$(GO) test -race -count=1 -timeout 15m $(PKGS)
	$(GO) test -count=1 -timeout 2m -run '^TestProxiedRequestDoesNotAllocate$$' ./internal/e2e/
	cd tools/deploytest && GO=$(GO) $(GO) test -count=1 -timeout 5m ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# fuzz runs every fuzz target of the module, one at a time, for FUZZTIME
# each: by default 10 million executions (`make fuzz FUZZTIME=30s` for a
# quick look; FUZZFLAGS='-parallel 1' to leave cores free). The seed corpora
# alone, with testdata/fuzz, run in `make test`. After each target,
# tools/fuzz/keep-corpus.sh copies the smallest FUZZ_KEEP inputs of at most
# FUZZ_KEEP_BYTES each from the fuzz cache (where Go keeps what found new
# coverage) into testdata/fuzz/<target>/cache-*; commit them so later runs
# start from there. FUZZMINIMIZETIME caps the minimizing of each new input
# (with Go's default, 60s, FuzzParse spent most of its time minimizing
# variants of the 4 KB example configuration). Targets are found by name
# (`func FuzzX(` in a test file), which needs no build. docs/fuzzing.md
# has the procedure and the results.
FUZZTIME  ?= 10000000x
FUZZFLAGS ?=
FUZZMINIMIZETIME ?= 10s
FUZZ_KEEP ?= 64
FUZZ_KEEP_BYTES ?= 4096
export FUZZ_KEEP FUZZ_KEEP_BYTES
fuzz:
	@for pkg in $$($(GO) list $(PKGS)); do \
		dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
		for f in $$(cat $$dir/*_test.go 2>/dev/null | sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p'); do \
			echo "== $$pkg $$f"; \
			$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) $(FUZZFLAGS) $$pkg || exit 1; \
			tools/fuzz/keep-corpus.sh $$dir $$pkg $$f || exit 1; \
		done; \
	done

clean:
	rm -rf $(BIN)
