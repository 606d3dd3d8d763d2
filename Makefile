# appleid-broker — the two commands a newcomer needs are `make run` and `make test`.
.PHONY: run test build release clean bench-login bench-notifications bench-deletion

## Run the service (installs Debian packages if missing, builds, starts an embedded
## PostgreSQL and, unless Apple settings are given, the Apple simulator).
run:
	scripts/run.sh

## Run every test (what CI runs).
test:
	scripts/test.sh

build:
	swift build

release:
	swift build -c release

clean:
	rm -rf .build

## Login benchmark: req/s, p50/p99, CPU/req, RSS; pgbench reference; A/B against the Go peer.
bench-login:
	scripts/bench-login.sh

## Notification ingestion benchmark: notifications/s, p99, ratio to pgbench of the same work.
bench-notifications:
	scripts/bench-notifications.sh

## Deletion benchmark: deletions/s with 100 ms added to every revoke, against concurrency / latency.
bench-deletion:
	scripts/bench-deletion.sh
