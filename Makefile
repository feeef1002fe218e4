# brisk — make help lists the targets.
GO        ?= go
BIN       ?= bin/brisk
PKGS      ?= ./...
TEST_TIMEOUT ?= 20m
# Each of h1's differential fuzz targets runs this long in `make test`.
FUZZTIME  ?= 20s
# package:target pairs (go test fuzzes one target per run)
FUZZ_TARGETS = internal/h1:FuzzRequestHead internal/h1:FuzzReplyHead internal/h1:FuzzChunked pkg/spec:FuzzDecode

PREFIX    ?= /usr/local

.PHONY: help build build-demo install demo up test test-short fuzz partitions readme-check vet fmt bench microbench proto setup setup-test clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build bin/brisk, bin/brisk-trace (the lean trace function) and bin/brisk-sandbox-init (the native runtime's init)
	$(GO) build -o $(BIN) ./cmd/brisk
	CGO_ENABLED=0 $(GO) build -ldflags="-s -w" -o $(dir $(BIN))brisk-trace ./cmd/brisk-trace
	./scripts/build-sandbox-init.sh $(dir $(BIN))brisk-sandbox-init

build-demo: ## build only what the demo runs: bin/brisk and bin/brisk-trace (no C compiler needed)
	$(GO) build -o $(BIN) ./cmd/brisk
	CGO_ENABLED=0 $(GO) build -ldflags="-s -w" -o $(dir $(BIN))brisk-trace ./cmd/brisk-trace

install: build ## copy bin/brisk, bin/brisk-trace and bin/brisk-sandbox-init to $(PREFIX)/bin
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(BIN) $(dir $(BIN))brisk-trace $(dir $(BIN))brisk-sandbox-init $(DESTDIR)$(PREFIX)/bin/

demo: build-demo ## start a local cluster, deploy and call functions, keep serving until Ctrl-C
	./scripts/demo.sh

up: build ## run a local cluster (brisk up) in the foreground
	./$(BIN) up

test: setup-test vet ## install what the tests need (scripts/setup.sh --test), run the whole suite (unit, race, integration, bounded fuzzing) — what CI runs
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)
	$(MAKE) fidelity
	$(MAKE) fuzz

fidelity: ## brisk sim against brisk replay on a local cluster (no race detector: it would be what is measured)
	$(GO) test -count=1 -timeout 10m -run 'TestSimAgreesWithReplay' -v ./internal/bench

partitions: ## every partition lab schedule at full length (LAB_HOLD each, 90s by default; CI runs a subset with 6 s): docs/reliability.md, "Partitions"
	$(GO) test ./test/e2e -run 'TestPartition' -count=1 -v -timeout 60m -lab-all -lab-hold $(or $(LAB_HOLD),90s)

fuzz: ## run the fuzz targets (h1 against net/http, the spec parser), FUZZTIME each
	@for pt in $(FUZZ_TARGETS); do \
	  p=$${pt%%:*}; t=$${pt#*:}; \
	  echo "fuzz $$p $$t for $(FUZZTIME)"; \
	  GO=$(GO) ./scripts/fuzz.sh $$p $$t $(FUZZTIME) || exit 1; \
	done

readme-check: build ## run every shell command of README.md against a local cluster it starts (scripts/check-readme.sh; README markers say what it skips)
	BRISK=$(BIN) ./scripts/check-readme.sh

test-short: ## unit tests only, no race detector
	$(GO) test -short -count=1 $(PKGS)

vet: ## go vet and gofmt check
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

bench: build ## run the standard benchmark set on local clusters; writes bench-results/<time>/report.md
	./scripts/bench.sh

microbench: ## run the Go microbenchmarks with allocations
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

proto: ## regenerate api/brisk/v1 from brisk.proto (needs protoc: make setup)
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	PATH="$$($(GO) env GOPATH)/bin:$$PATH" protoc --go_out=. --go_opt=paths=source_relative \
	  --go-grpc_out=. --go-grpc_opt=paths=source_relative api/brisk/v1/brisk.proto

setup: ## install what building brisk and the demo need: Go, make, curl (Debian; root)
	./scripts/setup.sh

setup-test: ## install what the tests and code generation need, once per machine (Debian; root): make test runs it
	./scripts/setup.sh --test

clean:
	rm -rf bin
