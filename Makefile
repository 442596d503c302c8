# smg build, test and code generation. `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/.bin
PLUGINS := $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/protoc-gen-grpc-gateway $(BIN)/protoc-gen-openapiv2 $(BIN)/staticcheck
TEST_FLAGS ?= -race -timeout 10m
BENCH ?= .
BENCHTIME ?= 1s
FUZZTIME ?= 30s

.PHONY: help tools generate check-generate build test lint bench run clean docs image image-test chaos fuzz

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

$(PLUGINS): tools/go.mod tools/go.sum
	cd tools && GOBIN=$(BIN) $(GO) install \
		github.com/bufbuild/buf/cmd/buf \
		google.golang.org/protobuf/cmd/protoc-gen-go \
		google.golang.org/grpc/cmd/protoc-gen-go-grpc \
		github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway \
		github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2 \
		honnef.co/go/tools/cmd/staticcheck
	@touch $(PLUGINS)

tools: $(PLUGINS) ## install the pinned code generators and staticcheck into .bin/

generate: $(PLUGINS) ## lint the protos and regenerate gen/
	$(BIN)/buf lint
	$(BIN)/buf generate

check-generate: generate ## fail when gen/ is stale
	@if [ -n "$$(git status --porcelain -- gen)" ]; then \
		echo "gen/ is stale: run 'make generate' and commit the result"; git status --porcelain -- gen; exit 1; fi

fuzz: ## run every fuzz test (parsers, URL normalisation, admin input) for FUZZTIME each
	@for f in $$(grep -rl --include='*_test.go' '^func Fuzz' . | sort); do \
		for fn in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "== $$fn ($$(dirname $$f))"; \
			$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) ./$$(dirname $$f) || exit 1; \
		done; \
	done

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/smg-project/smg/internal/version.Version=$(VERSION) -X github.com/smg-project/smg/internal/version.Commit=$(COMMIT)

build: ## build bin/smg (version and commit stamped into `smg --version`)
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/smg ./cmd/smg

image: ## build the container image with podman (static smg on scratch) and write bin/smg-image.tar (OCI)
	VERSION=$(VERSION) COMMIT=$(COMMIT) bash scripts/image.sh bin/smg-image.tar

chaos: ## network-fault suite: each component in its own network namespace, iptables faults under load (root; SHORT=1: CI variant)
	SMG_CHAOS=1 SHORT=$(SHORT) CHAOS_OUT=$(CHAOS_OUT) $(GO) test -count=1 -v -timeout 20m ./chaos/

image-test: image ## run the image's sim, control plane, agent and router as containers; stream, /readyz, /metrics, SIGTERM
	bash scripts/image-test.sh localhost/smg:$(VERSION)

test: ## run every test with the race detector, then without it the packages whose race build swaps their raw system calls for the runtime's
	$(GO) test $(TEST_FLAGS) ./...
	$(GO) test -count=1 ./internal/sendwait/

lint: $(PLUGINS) ## buf lint, go mod tidy -diff, go vet, gofmt, staticcheck
	$(BIN)/buf lint
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run 'go mod tidy' and commit the result"; exit 1; }
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(BIN)/staticcheck ./...

bench: ## run the benchmarks
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem ./...

run: build ## smg launch on :30000 against 3 simulated engines on :8001-8003 (Ctrl-C stops)
	@bin/smg sim --count 3 --port 8001 & sim=$$!; trap "kill $$sim 2>/dev/null" EXIT INT TERM; \
	bin/smg launch --port 30000 --worker-urls http://127.0.0.1:8001 http://127.0.0.1:8002 http://127.0.0.1:8003

docs: ## rewrite docs/cli/*.md from each subcommand's --help
	$(GO) test ./cmd/smg -run TestCLIDocsListEveryFlag -update

clean: ## remove build outputs
	rm -rf bin .bin

# SHORT=1 runs the CI smoke variant: every configuration at 0.5x and 2x for a
# few seconds, asserting shapes (results, sheds with Retry-After) not timings.
.PHONY: bench-overload bench-faults bench-ha bench-scale bench-proxy
# AGENT_POLL is the node agent's poll interval in both benchmarks (0: no agent,
# the control plane polls the engines over HTTP every second).
AGENT_POLL ?= 50ms
bench-overload: build ## 4 simulated engines at 0.5x-2x capacity under every protection and window config (reported and learned windows, 1 and 3 routers), then heterogeneous requests at 1x-4x under TTFT objectives, windows alone and nginx, then a steady tenant beside a flooding one with and without fair shares: docs/benchmarks.md, docs/img (SHORT=1: smoke test)
ifeq ($(SHORT),1)
	SMG_BENCH_BIN=$(CURDIR)/bin/smg $(GO) test -count=1 -run 'TestOverloadSmoke|TestObjectiveSmoke' -v ./bench/suite/
else
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || { apt-get update && apt-get install -y nginx; }
	$(GO) run ./bench/cmd/benchsuite --bin bin/smg --suite overload --agent-poll $(AGENT_POLL)
endif

bench-faults: build ## the same fleet at 1x while one engine is killed, then one frozen: docs/benchmarks.md, docs/img
	$(GO) run ./bench/cmd/benchsuite --bin bin/smg --suite faults --agent-poll $(AGENT_POLL) $(if $(filter 1,$(SHORT)),--short)

bench-scale: ## one control plane, N synthetic workers through agents, R synthetic routers (up to 10,000 and 1,000): docs/benchmarks.md, docs/img (SHORT=1: smoke test)
	$(GO) run ./bench/cmd/benchsuite --suite scale $(if $(filter 1,$(SHORT)),--short)

# nginx and wrk come from apt when missing (root, Debian/Ubuntu).
bench-proxy: build ## smg launch beside nginx in front of the same 2 fast simulated engines, sharing the CPUs with wrk and the engines and on a CPU of its own: CPU per request and per streamed token, req/s, what bounds it, profiles (docs/benchmarks.md; SHORT=1: smoke test)
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || { apt-get update && apt-get install -y nginx; }
	@command -v wrk >/dev/null || { apt-get update && apt-get install -y wrk; }
	$(GO) run ./bench/cmd/benchsuite --bin bin/smg --suite proxy $(if $(filter 1,$(SHORT)),--short)

bench-ha: ## admin writes through Raft (3 replicas, 1 with --data-dir) against 1 in memory, and failover over 10 leader kills: table in docs/bench-raw/ha.md
	mkdir -p docs/bench-raw && SMG_HA_BENCH=1 SMG_HA_BENCH_OUT=$(CURDIR)/docs/bench-raw/ha.md $(GO) test -count=1 -run TestHABenchmark -timeout 10m -v ./e2e/
