# taskledger — `make help` lists the targets.
GO            ?= go
STATICCHECK   := honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOLANGCI_LINT := github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
# FUZZTIME is a count of runs (2000x), not a duration: at a duration's end Go 1.26's fuzz
# coordinator can report "context deadline exceeded" for a worker still running
# (golang/go#75804, fixed in Go 1.27), which failed CI on a loaded machine.
FUZZTIME      ?= 2000x
BENCH_SCALE   ?= 1
PEERS         ?=
COUNT         ?= 10
PYTHON        ?= python3

.PHONY: help run build test test-python fuzz bench bench-doc bench-micro lint screenshots

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

run: ## run the scheduler with an embedded NATS server (data in ./data, API on 127.0.0.1:8080)
	$(GO) run ./cmd/taskledger serve

build: ## build bin/taskledger
	$(GO) build -o bin/taskledger ./cmd/taskledger

test: ## vet, every test under the race detector, the Python SDK's tests, each fuzz target briefly, a BENCH_SCALE=0.1 bench smoke
	$(GO) vet ./...
	$(GO) vet -tags crashpoints ./...
	$(GO) vet -tags cluster ./...
	$(GO) test -race -count=1 -timeout 30m ./...
	$(MAKE) test-python
	$(MAKE) fuzz FUZZTIME=$(FUZZTIME)
	$(MAKE) bench BENCH_SCALE=0.1

test-python: ## the Python SDK's unittest suite against a real taskledger serve built from this checkout (needs python3 >= 3.10)
	@command -v $(PYTHON) >/dev/null || (echo "test-python: $(PYTHON) not found; install Python 3.10 or later (.ci/run does)" >&2; exit 1)
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10) and "test-python: Python 3.10 or later is needed, not " + sys.version.split()[0])'
	$(PYTHON) -m unittest discover -s sdk/python/tests -t sdk/python

fuzz: ## run every fuzz target for FUZZTIME each
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./events
	$(GO) test -run '^$$' -fuzz '^FuzzValidID$$' -fuzztime $(FUZZTIME) ./events
	$(GO) test -run '^$$' -fuzz '^FuzzUnmarshalReady$$' -fuzztime $(FUZZTIME) ./events
	$(GO) test -run '^$$' -fuzz '^FuzzCompactJSON$$' -fuzztime $(FUZZTIME) ./aggregate
	$(GO) test -run '^$$' -fuzz '^FuzzScheduleBody$$' -fuzztime $(FUZZTIME) ./internal/httpapi
	$(GO) test -run '^$$' -fuzz '^FuzzClaimBody$$' -fuzztime $(FUZZTIME) ./internal/httpapi
	$(GO) test -run '^$$' -fuzz '^FuzzResultBody$$' -fuzztime $(FUZZTIME) ./internal/httpapi
	$(GO) test -run '^$$' -fuzz '^FuzzCancelBody$$' -fuzztime $(FUZZTIME) ./internal/httpapi
	$(GO) test -run '^$$' -fuzz '^FuzzMailboxBody$$' -fuzztime $(FUZZTIME) ./internal/httpapi
	$(GO) test -run '^$$' -fuzz '^FuzzListQuery$$' -fuzztime $(FUZZTIME) ./internal/httpapi
	$(GO) test -run '^$$' -fuzz '^FuzzTaskPath$$' -fuzztime $(FUZZTIME) ./internal/httpapi
	$(GO) test -run '^$$' -fuzz '^FuzzRunBody$$' -fuzztime $(FUZZTIME) ./internal/httpapi

bench: ## one table: lifecycle, latency, timers, replay, memory vs the raw JetStream ceiling (BENCH_SCALE scales the work)
	BENCH_SCALE=$(BENCH_SCALE) $(GO) run ./cmd/taskledger bench

bench-doc: ## run the bench (BENCH_SCALE) with --json into docs/benchmarks.json and render docs/benchmarks.md from it; PEERS=a.txt,b.txt adds peers' results of the same sitting
	BENCH_SCALE=$(BENCH_SCALE) $(GO) run ./cmd/taskledger bench --json --peers "$(PEERS)" > docs/benchmarks.json.tmp
	mv docs/benchmarks.json.tmp docs/benchmarks.json
	$(GO) run ./cmd/taskledger bench --markdown docs/benchmarks.json > docs/benchmarks.md

bench-micro: ## hot-function benchmarks for benchstat (COUNT runs each)
	$(GO) test -run '^$$' -bench 'Encode|Decode|Replay|Decide|Apply' -count $(COUNT) ./internal/bench

screenshots: ## regenerate the console screenshots in docs/ (needs chromium)
	TASKLEDGER_SCREENSHOTS=$(CURDIR)/docs $(GO) test -count=1 -run '^TestConsole$$/^Screenshots$$' ./internal/console

lint: ## gofmt, go vet, staticcheck and golangci-lint
	@test -z "$$(gofmt -l .)" || (gofmt -l . && exit 1)
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	$(GO) run $(GOLANGCI_LINT) run ./...

.PHONY: cluster-test
cluster-test: ## 3-node NATS cluster failover test (CLUSTER_SECONDS, default 60; CLUSTER_SHARDS event streams, default 3)
	CLUSTER_SECONDS=$${CLUSTER_SECONDS:-60} CLUSTER_SHARDS=$${CLUSTER_SHARDS:-3} $(GO) test -tags cluster -count=1 -run TestClusterFailover -v -timeout 30m ./cmd/taskledger

.PHONY: cluster-bench
cluster-bench: ## scaling figures on a 3-node NATS cluster: 1-3 processes, K shards, leases on/off, kills (CLUSTER_BENCH_SECONDS per row, default 8)
	CLUSTER_BENCH_SECONDS=$${CLUSTER_BENCH_SECONDS:-8} $(GO) test -tags cluster -count=1 -run '^TestClusterBench$$' -v -timeout 15m ./cmd/taskledger

.PHONY: soak
soak: ## kill -9 soak test (SOAK_SECONDS, default 120)
	SOAK_SECONDS=$${SOAK_SECONDS:-120} $(GO) test -race -count=1 -run TestSoakKillNine -v -timeout 30m ./cmd/taskledger

.PHONY: powercut
powercut: ## power cuts (POWERCUT_CUTS, default 20, per mode): serve on a FUSE file system that drops unsynced writes; fsync must lose 0 acknowledged writes, os reports its losses (needs /dev/fuse, root)
	POWERCUT_CUTS=$${POWERCUT_CUTS:-20} POWERCUT_LOAD=$${POWERCUT_LOAD:-300} $(GO) test -count=1 -run '^TestPowerCut$$' -v -timeout 30m ./cmd/taskledger

.PHONY: attack
attack: ## 2,000 slow-body connections beside normal requests; fails if their p99 is 100 ms or more (ATTACK_CONNS)
	ATTACK_CONNS=$${ATTACK_CONNS:-2000} ATTACK_MEASURE=1 $(GO) test -count=1 -run '^TestSlowBodyAttack$$' -v -timeout 10m ./internal/httpapi
