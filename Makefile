# Gavel's build. Every tool comes from go.mod's tool directives: nothing is installed by hand.
GO       ?= go
PKGS     ?= ./...
BUF      := $(GO) tool buf
BIN      := bin
TESTFLAGS ?= -count=1 -timeout 20m
BENCHFLAGS ?= -run '^$$' -bench . -benchtime 1x -count 1 -timeout 30m

.PHONY: all generate build check lint fmt vet layers test test-fast test-race test-cluster image compose-certs bench bench-scale bench-router run clean

all: check build test

## generate: regenerate pkg/gen from proto/ (committed; never edit by hand)
generate:
	$(BUF) generate

## build: static binaries of every service and the CLI into bin/
build:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/... ./services/*/cmd/...

## check: buf lint and breaking, gofmt and goimports, go vet, the layers, generated code up to date
check: lint fmt vet layers
	@tmp=$$(mktemp -d); cp -r pkg/gen $$tmp/gen; \
	$(BUF) generate && diff -r $$tmp/gen pkg/gen >/dev/null; st=$$?; rm -rf $$tmp; \
	if [ $$st -ne 0 ]; then echo "pkg/gen is stale: run 'make generate' and commit"; exit 1; fi
	@echo "check: ok"

lint:
	$(BUF) lint
	@if git rev-parse --verify -q main >/dev/null && git cat-file -e main:buf.yaml 2>/dev/null; then \
		$(BUF) breaking --against '.git#branch=main'; \
	else echo "buf breaking: no main branch with protos yet, skipped"; fi

GOFILES = $$(git ls-files '*.go'; git ls-files --others --exclude-standard '*.go')

fmt:
	@out=$$(gofmt -l $(GOFILES)); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@out=$$($(GO) tool goimports -l -local github.com/gavel-sched/gavel $$(echo $(GOFILES) | tr ' ' '\n' | grep -v '^pkg/gen/')); \
	if [ -n "$$out" ]; then echo "goimports would change:"; echo "$$out"; exit 1; fi

## layers: pkg/ never imports services/ or internal/; service binaries never link the etcd server nor testing
layers:
	@bad=$$($(GO) list -f '{{.ImportPath}}: {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./pkg/... | \
		grep -E ' github.com/gavel-sched/gavel/(services|internal)/' | cut -d: -f1); \
	if [ -n "$$bad" ]; then echo "pkg/ imports services/ or internal/:"; echo "$$bad"; exit 1; fi
	@for b in ./services/*/cmd/*; do \
		deps=$$($(GO) list -deps $$b) || exit 1; \
		if echo "$$deps" | grep -q '^go.etcd.io/etcd/server/'; then echo "$$b links go.etcd.io/etcd/server"; exit 1; fi; \
		if echo "$$deps" | grep -qx testing; then echo "$$b links testing (test helpers belong in packages only tests import, e.g. pkg/logging/logtest)"; exit 1; fi; \
	done

vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags cluster ./test/cluster/

## test: the whole suite (unit, integration over embedded etcd and loopback gRPC, fuzz seed corpora)
test:
	$(GO) test $(TESTFLAGS) $(PKGS)

## test-fast: the edit loop: unit and in-process integration tests (-short skips e2e over built binaries and long runs)
test-fast:
	$(GO) test -short -count=1 -timeout 5m $(PKGS)

## test-race: the race detector over the packages with concurrency: the BBS (its service tests
## drive internal/core, which has no tests of its own), its store, callbacks and peers; the rep,
## its cell and its sim backend; the auctioneer; the route-emitter; nsync; the router; grpcx,
## lifecycle, etcdx
RACE_PKGS ?= ./services/bbs/ ./services/bbs/internal/... ./services/rep/ ./services/rep/internal/cell/ \
	./services/rep/internal/executor/sim/ \
	./services/auctioneer/... ./services/routeemitter/... ./services/nsync/... ./services/router/... \
	./pkg/grpcx/ ./pkg/lifecycle/ ./pkg/etcdx/...
test-race:
	$(GO) test -race -count=1 -timeout 30m $(RACE_PKGS)

## test-cluster: the multi-host test bed over Docker containers (test/cluster; needs a docker engine)
test-cluster:
	$(GO) test -tags cluster -count=1 -timeout 20m ./test/cluster/

## image: the FROM-scratch image of every static binary (deployments/docker), tagged $(IMAGE), and the compose Prometheus image $(PROMETHEUS_IMAGE) (from the installed prometheus)
IMAGE ?= gavel:dev
PROMETHEUS_IMAGE ?= gavel-prometheus:dev
image:
	deployments/docker/build.sh $(IMAGE) $(PROMETHEUS_IMAGE)

## compose-certs: the certificates deployments/docker/compose.yaml mounts (every identity, valid for every member's address)
## COMPOSE_NET is the /24's first three octets (compose.yaml's GAVEL_NET), COMPOSE_PKI the directory (its GAVEL_PKI)
COMPOSE_NET ?= 172.29.0
COMPOSE_PKI ?= deployments/docker/pki
COMPOSE_HOSTS := $(addprefix $(COMPOSE_NET).,10 11 12 20 21 30 31 40 41 42 45 50 60) \
	bbs-0 bbs-1 auctioneer-0 auctioneer-1 rep-z1 rep-z2 rep-z3 nsync routeemitter router
compose-certs:
	$(GO) run ./cmd/gavel certs $(addprefix --host ,$(COMPOSE_HOSTS)) $(COMPOSE_PKI) \
		etcd bbs auctioneer route-emitter router nsync admin read-only prometheus rep/cell-z1 rep/cell-z2 rep/cell-z3

## bench: benchmarks (figures quoted in the service READMEs)
bench:
	$(GO) test $(BENCHFLAGS) ./pkg/transform/ ./services/... ./test/integration/

## bench-scale: the scale harness (test/scale) at full size, 5,000 cells and 250,000 instances,
## as deployed (each service its own process of the built binaries, mutual TLS, cells in sim
## hosts of 100), printing its report; sizes and phases from ARGS, e.g. make bench-scale
## ARGS='-quick', ARGS='-cells 1000 -instances 100000' or ARGS='-in-process' (everything in one
## process over plaintext, for profiles and the cost of TLS and process boundaries)
ARGS ?=
bench-scale:
	$(GO) test -run '^$$' -bench BenchmarkScale -benchtime 1x -count 1 -timeout 3h ./test/scale/ -args $(ARGS)

## bench-router: the router side by side with HAProxy (the data-plane comparison): wrk over
## the sample app directly, through HAProxy and through the router, plain, TLS and with 1,000
## routes; needs haproxy and wrk (skips with one line without them). BENCH_ROUTER_FLAGS adds go
## test flags, e.g. BENCH_ROUTER_FLAGS='-cpuprofile /tmp/router.prof' profiles the router
BENCH_ROUTER_FLAGS ?=
bench-router:
	$(GO) test -run '^$$' -bench BenchmarkRouterVsHAProxy -benchtime 1x -count 1 -timeout 20m $(BENCH_ROUTER_FLAGS) ./services/router/

## run: a local cluster on the embedded default (embedded etcd and every service, process-backend cells); DEV_FLAGS adds gavel dev flags, e.g. -plugin NAME=SOCKET, or --cell-backend oci for real containers (root, containerd, runc, CNI plugins)
run:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/gavel ./examples/hello
	$(BIN)/gavel dev -sample-app $(BIN)/hello $(DEV_FLAGS)

clean:
	rm -rf $(BIN)
