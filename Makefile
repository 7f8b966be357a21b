# delaybridge: `make test` is what CI runs (.ci/run). `make help` lists targets.
GO       ?= go
PKGS     := ./...
# The packages whose tests take longest, given first so that go test starts
# them first (it runs packages in the order given, -p at a time): listed
# last by ./..., test/e2e started 6 minutes into make test and ended it.
SLOW     := ./test/e2e/ ./pkg/brokers/rabbitbroker/ ./internal/testenv/ ./pkg/store/ ./test/ui/ ./test/docs/
# deploy/ is a Go module of its own: its tests use Kubernetes', compose's,
# BuildKit's and systemd's parsers, which must stay out of the daemon's go.mod.
DEPLOY   := deploy
BIN      := bin/delaybridge
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X github.com/delaybridge/delaybridge/cmd/delaybridge/cli.version=$(VERSION)
# Fuzzing budget per target, as a count of executions: about 10 s and 15
# CPU-s each here (300000x took 43-52 s and 73 CPU-s each, a quarter of make
# test's CPU; the seed corpora run in every go test too). A count, because
# a duration races Go 1.26's fuzz coordinator at its deadline and fails with a
# bare "context deadline exceeded" on a busy machine (golang/go#75804, fixed
# in Go 1.27); a count has no deadline to race. FUZZTIME=30s works too.
FUZZTIME ?= 60000x

.PHONY: help build dev deps test short lint unit unit-root unit-deploy fuzz fault fault-ci clean bench

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## build bin/delaybridge (production: without the dev command's embedded NATS and Redis)
	CGO_ENABLED=0 $(GO) build -trimpath -tags nodev -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/delaybridge

dev: ## run the local quickstart (embedded NATS + Redis + daemon)
	$(GO) run ./cmd/delaybridge dev

deps: ## install what the tests run (scripts/test-deps.sh): with apt-get redis-server, redis-tools, rabbitmq-server, chromium, prometheus (promtool), systemd (systemd-analyze), zsh, fish, python3-confluent-kafka, curl; helm with go install
	bash scripts/test-deps.sh

# The test targets run side by side: most of their time is waiting (servers
# starting, outages, due times), which one after the other added up to 18
# minutes on 2 cores (9m42s side by side, 818 CPU-s). -Oline prints each
# command's output whole when it ends.
test: deps lint ## everything CI runs: deps, gofmt, vet, then side by side tests with -race, short fuzzing and the fault suite (smaller)
	@$(MAKE) --no-print-directory -j4 -Oline unit fault-ci fuzz

short: ## the tests that need no server (go test -short; about a minute): a quick check while changing code
	$(GO) test -short -count=1 $(PKGS)

lint: ## gofmt and go vet
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "not gofmt-formatted:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	cd $(DEPLOY) && $(GO) vet ./...

unit: unit-root unit-deploy ## all tests, with the race detector, against real servers (and the deploy/ module's)

unit-root:
	$(GO) test -race -count=1 -timeout 20m -p 3 $(SLOW) $(PKGS)

unit-deploy:
	cd $(DEPLOY) && $(GO) test -race -count=1 -timeout 10m ./...

fuzz: ## each fuzz target for FUZZTIME (default 60000 executions, ~10 s)
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./pkg/envelope/
	$(GO) test -run '^$$' -fuzz '^FuzzParseDialects$$' -fuzztime $(FUZZTIME) ./pkg/envelope/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./pkg/envelope/
	$(GO) test -run '^$$' -fuzz '^FuzzCodecRoundTrip$$' -fuzztime $(FUZZTIME) ./pkg/envelope/

bench: ## end-to-end benchmark of the real binary (~20 min): table to docs/performance.md, numbers to test/bench/bench.json
	$(GO) test -tags bench -run TestBench -timeout 60m -v ./test/bench/ -args -out bench.json -doc $(CURDIR)/docs/performance.md $(BENCHFLAGS)

fault: ## fault-injection suite against the real binary and real servers (~5 min): table to docs/reliability.md
	$(GO) test -tags fault -count=1 -timeout 20m -parallel 1 -v ./test/fault/ -args -report $(CURDIR)/docs/reliability.md $(FAULTFLAGS)

fault-ci: ## the fault suite at half size, without rewriting docs/reliability.md (part of make test)
	$(GO) test -tags fault -count=1 -timeout 20m -parallel 2 ./test/fault/ -args -scale 0.5

clean: ## remove build output and the dev state
	rm -rf bin .delaybridge-dev
