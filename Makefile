# The two commands: `make run` and `make test`. Everything else is what they are made of.
SHELL := /bin/bash
GO ?= go
export CGO_ENABLED ?= 0

BIN := bin/hermes-host
GO_SOURCES := $(shell find . -name '*.go' -not -path './node_modules/*' -not -path './.pgdata/*') go.mod go.sum $(wildcard migrations/*.sql sartiq/backend/migrations/*.sql) sartiq/backend/openapi.yaml

.PHONY: run test build generate lint test-go clean

## run: start Postgres if none is given, migrate, and run the whole product (hermes-host dev).
run: build
	scripts/with-services.sh $(BIN) dev

## build: write bin/hermes-host.
build: $(BIN)

$(BIN): $(GO_SOURCES)
	$(GO) build -trimpath -o $@ ./cmd/hermes-host

## generate: regenerate generated code.
generate:
	$(GO) generate ./...

## lint: gofmt, go vet and staticcheck.
lint:
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt would change:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

## test: every test (real Postgres), with the race detector, after lint.
test: lint build
	scripts/with-services.sh $(MAKE) --no-print-directory test-go

test-go:
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 15m ./...


clean:
	rm -rf bin
