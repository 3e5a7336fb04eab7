# retryd — three modules (the server at the root, the SDK in pkg, the
# bench), joined by go.work; github.com/retryd/retryd/... names all three.
# `make test` is the command CI runs (through .ci/run); it needs Go and the
# Postgres 15 binaries, and starts everything else itself.

GO       ?= go
BIN      ?= $(CURDIR)/bin
PKGS     := github.com/retryd/retryd/...
STATICCHECK_VERSION := v0.8.2
BINARIES := \
	github.com/retryd/retryd/services/scheduler/cmd/retryd-scheduler \
	github.com/retryd/retryd/services/ingress/cmd/retryd-ingress \
	github.com/retryd/retryd/services/triggers/cmd/retryd-triggers \
	github.com/retryd/retryd/cmd/retryd \
	github.com/retryd/retryd/bench

.PHONY: all build test test-race test-short lint fmt tidy fuzz faults run dev bench-quick clean

all: build test

build:
	GOBIN=$(BIN) $(GO) install $(BINARIES)

test:
	./scripts/test

test-race:
	./scripts/test -race

test-short:
	./scripts/test -short

lint:
	./scripts/lint

fmt:
	gofmt -w $$(git ls-files '*.go')

# go mod tidy for the three modules (go mod tidy alone does not read
# go.work; the script explains).
tidy:
	./scripts/tidy

# A short fuzzing pass over every decoder (FUZZTIME per target).
fuzz:
	./scripts/fuzz

# The fault suite at full size (real processes, kill -9, restarts, purges;
# about 17 minutes on 2 cores). `make test` runs its short version; CI runs
# both. Needs the Postgres 15 server binaries and faketime: a scenario
# whose requirement is missing fails, it never skips.
faults:
	RETRYD_FAULTS=full $(GO) test -count=1 -timeout 60m -v github.com/retryd/retryd/faults/...

run dev:
	$(GO) run github.com/retryd/retryd/cmd/retryd dev

bench-quick:
	$(GO) run github.com/retryd/retryd/bench --quick all

clean:
	rm -rf $(BIN)
