# delaybridge: `make test` is what CI runs (.ci/run). `make help` lists targets.
GO       ?= go
PKGS     := ./...
# The packages of the daemon's own code, tested with the race detector, and
# the black-box ones (test/...), which drive a daemon binary built with it
# and run without it themselves (testenv.RaceDaemonEnv: the harness's code
# and the NATS and Kafka servers it embeds are not the daemon's).
CODE     := ./cmd/... ./internal/... ./pkg/...
BLACKBOX := ./test/...
# The packages whose tests take longest, longest first, so that go test
# starts them first (it builds and runs packages in the order given, -p at a
# time). Seconds each, alone on a quiet machine: test/e2e 245, rabbitbroker
# 80, ui 63, docs 57, store 47, kafkabroker 44, testenv 28, admin 25,
# natsbroker 24, daemon 22, ingest 19, dev 10, test/ops 11; the rest 1-8.
SLOW     := ./test/e2e/ ./test/ui/ ./test/docs/ \
            ./pkg/brokers/rabbitbroker/ ./pkg/store/ ./pkg/brokers/kafkabroker/ ./internal/testenv/ ./pkg/admin/ \
            ./pkg/brokers/natsbroker/ ./pkg/daemon/ ./pkg/ingest/ ./pkg/dev/
# Every go command of the targets builds without the checkout's path in
# what it compiles, so that the build cache serves any clone of the same
# sources: a clone in another directory compiled every package of the
# project again (go test -race of ./... 231 CPU-s, vet 73 here), about 4.5
# of make test's minutes with the other core busy.
export GOFLAGS := $(strip $(GOFLAGS) -trimpath)
# deploy/ is a Go module of its own: its tests use Kubernetes', compose's,
# BuildKit's and systemd's parsers, which must stay out of the daemon's go.mod.
DEPLOY   := deploy
BIN      := bin/delaybridge
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X github.com/delaybridge/delaybridge/cmd/delaybridge/cli.version=$(VERSION)
# Fuzzing budget per target, as a count of executions: a few seconds each
# (60000x took 100 s and 163 CPU-s for the six with their builds, about a
# sixth of make test's CPU, and held CI's run past 10 minutes; 300000x took
# 43-52 s and 73 CPU-s each; the seed corpora run in every go test too). A count, because
# a duration races Go 1.26's fuzz coordinator at its deadline and fails with a
# bare "context deadline exceeded" on a busy machine (golang/go#75804, fixed
# in Go 1.27); a count has no deadline to race. FUZZTIME=30s works too.
# 20000x took 53 CPU-s for the six, 10000x about half that.
FUZZTIME ?= 10000x

.PHONY: help build dev deps test short lint unit unit-code unit-blackbox race-daemons unit-deploy unit-layout fuzz fault fault-ci clean bench

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## build bin/delaybridge (production: without the dev command's embedded NATS and Redis)
	CGO_ENABLED=0 $(GO) build -trimpath -tags nodev -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/delaybridge

dev: ## run the local quickstart (embedded NATS + Redis + daemon)
	$(GO) run ./cmd/delaybridge dev

deps: ## install what the tests run (scripts/test-deps.sh): with apt-get redis-server, redis-tools, rabbitmq-server, chromium, prometheus (promtool), systemd (systemd-analyze), zsh, fish, python3-confluent-kafka, python3-celery, nodejs, npm, curl; helm with go install
	bash scripts/test-deps.sh

# The tests run with -vet=off: lint runs all of go vet on the same
# packages, and the subset go test runs before each package cost about 60
# CPU-s more on a clean clone (measured: go test -run NONE ./... with and
# without it, 116 and 52 CPU-s).
#
# The test targets run side by side, lint among them: most of their time is
# waiting (servers starting, outages, due times), which one after the other
# added up to 18 minutes on 2 cores (9m42s side by side, 818 CPU-s); vet
# first and the tests after it left the servers' waits 52-67 s behind. -Oline
# prints each command's output whole when it ends.
test: deps ## everything CI runs: deps, then side by side gofmt and vet, the tests with -race, short fuzzing and the fault suite (smaller)
	@$(MAKE) --no-print-directory -j7 -Oline lint unit fault-ci fuzz

short: ## the tests that need no server (go test -short): about a minute once built, about 4 minutes on a first run, which compiles everything; a quick check while changing code
	$(GO) test -short -count=1 $(PKGS)

lint: ## gofmt and go vet
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "not gofmt-formatted:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags fault,bench,faultinject ./test/fault/ ./test/bench/ ./pkg/daemon/
	cd $(DEPLOY) && $(GO) vet ./...

unit: unit-code unit-blackbox unit-deploy unit-layout ## all tests against real servers, the daemon's with the race detector (the deploy/ module's without)

# -parallel 4: the tests marked parallel (servers of their own, no timing
# bound: test/e2e's harness_test.go) mostly wait; two at a time (the
# default, GOMAXPROCS) kept test/e2e, the longest package, waiting on them.
# -p 2 each: unit-code and unit-blackbox run side by side.
#
# The daemon of the tests that run one (testenv.Build), built with -race
# once for every test binary instead of once in each (five linked their
# own, 6-7 CPU-s each); testenv.PrebuiltEnv says how they are found.
TESTBIN  := $(CURDIR)/bin/test

race-daemons:
	@mkdir -p $(TESTBIN)
	$(GO) build -race -o $(TESTBIN)/delaybridge-race ./cmd/delaybridge & p=$$!; \
	  $(GO) build -race -tags faultinject -o $(TESTBIN)/delaybridge-race-faultinject ./cmd/delaybridge && wait $$p

unit-code: race-daemons
	DELAYBRIDGE_TEST_BIN=$(TESTBIN) $(GO) test -race -vet=off -count=1 -timeout 20m -p 2 -parallel 4 $(filter-out ./test/%,$(SLOW)) $(CODE)

# Without -race in the test binary, with it in the daemon: test/e2e took
# 207 CPU-s with the detector in both, 150 with it in the daemon alone, 86
# without it (alone on a quiet machine). make test, back to back from warm
# clones: 918 CPU-s and 532 s with the black-box test binaries under -race,
# 846 CPU-s and 476 s without.
unit-blackbox: race-daemons
	DELAYBRIDGE_TEST_BIN=$(TESTBIN) DELAYBRIDGE_TEST_RACE_DAEMON=1 $(GO) test -vet=off -count=1 -timeout 20m -p 2 -parallel 4 $(filter ./test/%,$(SLOW)) $(BLACKBOX)

# The store's tests again in the layout a new store does not get
# (pkg/store/layout.go; DELAYBRIDGE_TEST_LAYOUT), so that both stay whole
# while stores of both are in use. Without -race: the layouts differ in
# the Lua run, not in Go's goroutines, which unit-code's run checks.
unit-layout:
	DELAYBRIDGE_TEST_LAYOUT=1 $(GO) test -vet=off -count=1 -timeout 10m ./pkg/store/

# Without -race: deploy/'s tests parse files one at a time (no goroutines of
# their own), and its race build of Kubernetes' and compose's packages cost
# 79 CPU-s and 2.5 minutes on a busy machine against 37 CPU-s without.
unit-deploy:
	cd $(DEPLOY) && $(GO) test -vet=off -count=1 -timeout 10m ./...

# The fuzz targets, as package:target, one test binary per package (go test
# -fuzz linked one per target, 6 CPU-s a link); each runs in its package's
# directory, with the corpus cache go test would give it.
FUZZ     := envelope:FuzzParse envelope:FuzzParseDialects envelope:FuzzDecode envelope:FuzzCodecRoundTrip \
            jsonlimit:FuzzCheck strictjson:FuzzDecode

fuzz: ## each fuzz target for FUZZTIME (default 10000 executions, a few seconds)
	@mkdir -p $(TESTBIN)
	@for p in $(sort $(foreach f,$(FUZZ),$(firstword $(subst :, ,$(f))))); do \
	  $(GO) test -c -vet=off -fuzz . -o $(TESTBIN)/$$p.fuzz ./pkg/$$p/ || exit 1; \
	done
	@for f in $(FUZZ); do p=$${f%%:*}; t=$${f#*:}; \
	  echo "fuzz $$p $$t"; \
	  (cd pkg/$$p && $(TESTBIN)/$$p.fuzz -test.run '^$$' -test.fuzz "^$$t$$" -test.fuzztime $(FUZZTIME) -test.timeout 10m \
	    -test.fuzzcachedir "$$($(GO) env GOCACHE)/fuzz/$$($(GO) list .)") || exit 1; \
	done

bench: ## end-to-end benchmark of the real binary (~20 min): table to docs/performance.md, numbers to test/bench/bench.json
	$(GO) test -tags bench -run TestBench -timeout 60m -v ./test/bench/ -args -out bench.json -doc $(CURDIR)/docs/performance.md $(BENCHFLAGS)

fault: ## fault-injection suite against the real binary and real servers (~5 min): table to docs/reliability.md
	$(GO) test -tags fault -count=1 -timeout 20m -parallel 1 -v ./test/fault/ -args -report $(CURDIR)/docs/reliability.md $(FAULTFLAGS)

fault-ci: ## the fault suite at half size, without rewriting docs/reliability.md (part of make test)
	$(GO) test -tags fault -vet=off -count=1 -timeout 20m -parallel 2 ./test/fault/ -args -scale 0.5

clean: ## remove build output and the dev state
	rm -rf bin .delaybridge-dev
