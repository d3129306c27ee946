# The two commands: `make run` and `make test`. Everything else is what they are made of.
SHELL := /bin/bash
GO ?= go
export CGO_ENABLED ?= 0

BIN := bin/hermes-host
AGENT := bin/scripted-agent
GO_SOURCES := $(shell find . -name '*.go' -not -path './node_modules/*' -not -path './.pgdata/*') go.mod go.sum $(wildcard migrations/*.sql sartiq/backend/migrations/*.sql static/*.css) sartiq/backend/openapi.yaml
# htmx and its SSE extension, from npm as package-lock.json pins them, copied where the binary
# embeds them from.
HTMX := static/vendor/htmx.min.js static/vendor/htmx-ext-sse.min.js

.PHONY: run test build generate lint test-go test-faults soak test-python fuzz bench bench-dashboard bench-live images clean

## run: start Postgres if none is given (and Docker when installed), build the images when an engine answers,
## migrate, and run the whole product (hermes-host dev): backend with demo jobs, gateway, dispatcher claiming.
run: build
	scripts/with-services.sh sh -c 'if scripts/docker.sh status; then $(BIN) images build $(BIN) $(AGENT); fi; exec $(BIN) dev'

## build: write bin/hermes-host and, beside it, the scripted agent that stands in for Hermes.
build: $(BIN) $(AGENT)

$(BIN): $(GO_SOURCES) $(HTMX)
	$(GO) build -trimpath -o $@ ./cmd/hermes-host

$(HTMX) &: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	mkdir -p static/vendor
	cp node_modules/htmx.org/dist/htmx.min.js static/vendor/htmx.min.js
	cp node_modules/htmx-ext-sse/dist/sse.min.js static/vendor/htmx-ext-sse.min.js

$(AGENT): $(GO_SOURCES)
	$(GO) build -trimpath -o $@ ./cmd/scripted-agent

## images: build the worker and dashboard images FROM scratch on the local Docker engine.
images: build
	@if scripts/docker.sh status; then $(BIN) images build $(BIN) $(AGENT); \
	else scripts/docker.sh start && { $(BIN) images build $(BIN) $(AGENT); rc=$$?; scripts/docker.sh stop; exit $$rc; }; fi

## generate: regenerate generated code (the templ components).
generate:
	$(GO) tool templ generate
	$(GO) generate ./...

## lint: the templ components' generated code is current, gofmt, go vet and staticcheck.
lint: $(HTMX)
	@$(GO) tool templ generate >/dev/null 2>&1 || $(GO) tool templ generate
	@if ! git diff --quiet -- templates || [ -n "$$(git ls-files --others --exclude-standard -- templates)" ]; then \
		echo "templates/*_templ.go are stale or not added: run make generate and commit them"; git status --short -- templates; exit 1; fi
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt would change:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

## test: every test (real Postgres), with the race detector, after lint.
test: lint build
	scripts/with-services.sh $(MAKE) --no-print-directory test-go test-faults test-python fuzz

test-go:
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 25m ./...

# The fault suite (faults/): the whole system on a Postgres cluster and a dockerd of its own,
# faults from a seeded schedule (HERMES_FAULT_SEED replays one), invariants checked after.
# It runs alone, after test-go, as it stops its engine and database mid-run.
test-faults:
	HERMES_FAULTS=1 CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 15m -run . -v ./faults/

## soak: the fault suite for 15 minutes of faults (HERMES_FAULTS_DURATION sets another length).
soak:
	HERMES_FAULTS=1 HERMES_FAULTS_SOAK=1 CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 60m -run . -v ./faults/

# The host's Hermes plugin, in Python's own unittest (standard library only). Its end-to-end
# case, against the hook socket of a real run-job, runs in test-go (worker TestPlugin*).
test-python:
	PYTHONDONTWRITEBYTECODE=1 python3 -m unittest discover -s hermesplugin -t hermesplugin

# Fuzz targets, each for a bounded number of runs (FUZZTIME; a count, not a duration: Go 1.26's
# fuzzer can report a bare "context deadline exceeded" when a -fuzztime duration ends, go.dev/issue/75804).
# -fuzzminimizetime keeps the fuzzers that do file I/O from spending their budget shrinking inputs.
FUZZTIME ?= 20000x
FUZZ_TARGETS := FuzzLoadJSON:./atomicfile/ FuzzOpenPath:./orghome/ FuzzDecodeRequest:./sartiq/backend/ FuzzParseCallArgs:./sartiq/sartiqcli/
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t%%:*} for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$${t%%:*}$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 200x "$${t#*:}" || exit 1; \
	done

## bench: the benchmarks whose figures the README reports (real Postgres), with the runs at the
## product's default timings (HERMES_BENCH_SLOW=1, about a minute each) and the scale run
## (HERMES_BENCH_SCALE=1: 200 orgs, 5,000 jobs, two dispatchers, on processes and on Docker;
## here about 20 minutes on processes and 40 on Docker; HERMES_BENCH_SCALE_DOCKER=0 skips
## Docker's) that a bare -bench skips. -p 1: one package's benchmarks at a time, so no two
## share the cores.
BENCHTIME ?= 2s
bench: build
	HERMES_BENCH_SLOW=1 HERMES_BENCH_SCALE=1 scripts/with-services.sh $(GO) test -p 1 -run '^$$' -bench . -benchtime $(BENCHTIME) -timeout 180m ./...

## bench-dashboard: the dashboard's pages under load from wrk in a second process (10,000 sessions, a
## 2,000-message transcript), through the launcher's proxy and directly, beside /healthz; about two minutes.
bench-dashboard:
	set -o pipefail; HERMES_BENCH_WRK=1 scripts/with-services.sh $(GO) test -count=1 -run '^TestDashboardUnderLoad$$' -v ./web/ | grep -E '^\s+(\||dashboard_load_test)'

## bench-live: the dashboard's live updates (SSE) to 200 streams of a load client in a second process, beside
## 1, while 300 mirror events are written (20/s): commit-to-arrival p50/p99, CPU and memory; under a minute, no Docker.
bench-live:
	set -o pipefail; HERMES_BENCH_SSE=1 WITH_DOCKER=0 scripts/with-services.sh $(GO) test -count=1 -run '^TestLiveUpdatesUnderLoad$$' -v ./web/ | grep -E '^\s+(\||live_load_test)'

clean:
	rm -rf bin static/vendor
