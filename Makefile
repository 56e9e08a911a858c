GO ?= go
CONFIG ?= examples/config
PKGS := ./...

.PHONY: run build test test-short vet fmt lint bench fuzz redis-deps

## run: serve the shipped example config with the in-memory backend
run:
	$(GO) run ./cmd/ratelimitd serve --config $(CONFIG) --backend memory

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/ratelimitd ./cmd/ratelimitd

## test: everything, with -race, including real redis-server tests
test: redis-deps vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) test -race -count=1 -timeout 40m $(PKGS)

test-short:
	$(GO) test -short -count=1 $(PKGS)

redis-deps:
	@./scripts/ensure-redis.sh

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

lint:
	golangci-lint run ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)
