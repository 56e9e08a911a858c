GO ?= go
CONFIG ?= examples/config
PKGS := ./...
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)

.PHONY: run build test test-long test-short vet fmt lint bench bench-compare callgrind-redis redis-deps memcached-deps postgres-deps image

IMAGE ?= ghcr.io/ratelimitd/ratelimitd

BIN ?= bin/ratelimitd
## RUN_ARGS: extra serve flags for `make run`, e.g. RUN_ARGS='--log-format=json'
RUN_ARGS ?=

## run: build bin/ratelimitd and serve the shipped example config with the in-memory backend.
## The recipe execs the binary (no `go run` in between), so Ctrl-C or a SIGTERM to make reaches the server
## and it shuts down gracefully, freeing its ports.
run: build
	exec $(BIN) serve --config $(CONFIG) --backend memory $(RUN_ARGS)

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/ratelimitd

## test: everything, with -race, including real redis-server, memcached and PostgreSQL tests
## (RATELIMITD_REQUIRE_REDIS=1, RATELIMITD_REQUIRE_POSTGRES=1: a test that needs redis-server,
## memcached or PostgreSQL fails instead of skipping);
## the fault and fleet suites run their quick variants (each fault, topology and burst shape at least once)
TEST_TIMEOUT ?= 40m
test: export RATELIMITD_REQUIRE_REDIS=1
test: export RATELIMITD_REQUIRE_POSTGRES=1
test: redis-deps memcached-deps postgres-deps vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)

## test-long: `make test` with the long variants of the fault and fleet suites (RATELIMITD_LONG=1:
## every repetition of the bursts)
test-long: export RATELIMITD_LONG=1
test-long: TEST_TIMEOUT = 120m
test-long: test

test-short:
	$(GO) test -short -count=1 $(PKGS)

redis-deps:
	@./scripts/ensure-redis.sh

memcached-deps:
	@./scripts/ensure-memcached.sh

postgres-deps:
	@./scripts/ensure-postgres.sh

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

## lint: golangci-lint (installed with `go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0`)
lint:
	golangci-lint run ./...

## image: build the container image (needs a Docker engine and a reachable registry for the base images; CI does not build it)
image:
	docker build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMAGE):$(VERSION) .

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

## bench-compare: ratelimitd (native and reference mode) against envoyproxy/ratelimit and a no-op gRPC floor in one run, with the lean-path targets (scripts/bench-compare.sh; DUR, ROUNDS, SCENARIOS)
DUR ?= 5s
ROUNDS ?= 3
bench-compare:
	./scripts/bench-compare.sh $(DUR) $(ROUNDS)

## callgrind-redis: Redis instructions per decision and batch sizes, ratelimitd (native and reference mode) vs the reference (scripts/callgrind-redis.sh; WORKLOADS, CG_SCRIPT; needs valgrind)
callgrind-redis:
	./scripts/callgrind-redis.sh
