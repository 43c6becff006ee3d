# Gavel's build. Every tool comes from go.mod's tool directives: nothing is installed by hand.
GO       ?= go
PKGS     ?= ./...
BUF      := $(GO) tool buf
BIN      := bin
TESTFLAGS ?= -count=1 -timeout 20m
BENCHFLAGS ?= -run '^$$' -bench . -benchtime 1x -count 1 -timeout 30m

.PHONY: all generate build check lint fmt vet test test-cluster image bench run clean

all: check build test

## generate: regenerate pkg/gen from proto/ (committed; never edit by hand)
generate:
	$(BUF) generate

## build: static binaries of every service and the CLI into bin/
build:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/... ./services/*/cmd/...

## check: buf lint and breaking, gofmt, go vet, generated code up to date
check: lint fmt vet
	@tmp=$$(mktemp -d); cp -r pkg/gen $$tmp/gen; \
	$(BUF) generate && diff -r $$tmp/gen pkg/gen >/dev/null; st=$$?; rm -rf $$tmp; \
	if [ $$st -ne 0 ]; then echo "pkg/gen is stale: run 'make generate' and commit"; exit 1; fi
	@echo "check: ok"

lint:
	$(BUF) lint
	@if git rev-parse --verify -q main >/dev/null && git cat-file -e main:buf.yaml 2>/dev/null; then \
		$(BUF) breaking --against '.git#branch=main'; \
	else echo "buf breaking: no main branch with protos yet, skipped"; fi

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go'; git ls-files --others --exclude-standard '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags cluster ./test/cluster/

## test: the whole suite (unit, integration over embedded etcd and loopback gRPC, fuzz seed corpora)
test:
	$(GO) test $(TESTFLAGS) $(PKGS)

## test-cluster: the multi-host test bed over Docker containers (test/cluster; needs a docker engine)
test-cluster:
	$(GO) test -tags cluster -count=1 -timeout 20m ./test/cluster/

## image: the FROM-scratch image of every static binary (deployments/docker), tagged $(IMAGE)
IMAGE ?= gavel:dev
image:
	deployments/docker/build.sh $(IMAGE)

## bench: benchmarks (figures quoted in the service READMEs)
bench:
	$(GO) test $(BENCHFLAGS) ./services/... ./test/integration/

## run: a local cluster on the embedded default (embedded etcd and every service)
run:
	$(GO) build -o $(BIN)/ ./cmd/gavel ./examples/hello
	$(BIN)/gavel dev -sample-app $(BIN)/hello

clean:
	rm -rf $(BIN)
