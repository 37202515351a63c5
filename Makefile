# Test targets read OUTBOX_TEST_POSTGRES_DSN (default postgres://postgres@127.0.0.1:5432/test?sslmode=disable).
GO ?= go
PKGS ?= ./...

.PHONY: test test-short test-race bench lint up demo chaos

## test: start local services if down, then the whole suite with the race detector (what CI runs),
## then the relay simulation over 10,000 seeds without it (the race detector makes it 7x slower;
## the race run covers 200 seeds).
SIM_SEEDS ?= 10000
test: up
	$(GO) test -race -count=1 -timeout 25m $(PKGS)
	OUTBOX_SIM_SEEDS=$(SIM_SEEDS) $(GO) test -count=1 -timeout 5m -run '^TestSimulation$$' .

## test-short: the suite in -short mode (smaller loads).
test-short:
	$(GO) test -race -count=1 -short $(PKGS)

## test-race: alias of test (every run uses -race).
test-race: test

## bench: `outbox bench` on the local PostgreSQL and on an SQLite file (the table a user gets on
## their own database), then the go test benchmarks (write path, drain, destinations).
BENCH_DSN ?= $(or $(OUTBOX_TEST_POSTGRES_DSN),postgres://postgres@127.0.0.1:5432/test?sslmode=disable)
bench:
	$(GO) run ./cmd/outbox bench --db '$(BENCH_DSN)'
	$(GO) run ./cmd/outbox bench --db "sqlite://$$(mktemp -d)/bench.db"
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m $(PKGS)

## chaos: the full chaos suite (private PostgreSQL, MariaDB and Redis, the shared MariaDB; relay processes killed, destination
## and database restarted); `make test` runs its short version. OUTBOX_CHAOS_REPORT=FILE keeps the cell table.
chaos:
	OUTBOX_CHAOS=full $(GO) test -count=1 -v -timeout 40m -run '^TestChaos(MariaDB)?$$' ./integration/chaos/

## lint: go vet, gofmt and golangci-lint when installed.
lint:
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l .)" || (gofmt -l .; exit 1)
	@if command -v golangci-lint >/dev/null; then golangci-lint run; else echo "golangci-lint not installed; ran go vet and gofmt"; fi

## up: start the local services the tests use.
up:
	bash scripts/services.sh
