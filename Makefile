# appleid-broker — the two commands a newcomer needs are `make run` and `make test`.
.PHONY: run test check build release clean bench bench-login bench-settings bench-notifications bench-deletion bench-webhooks bench-oidc resilience fuzz fuzz-api tsan

## Run the service (installs Debian packages if missing, builds, starts an embedded
## PostgreSQL and, unless Apple settings are given, the Apple simulator).
run:
	scripts/run.sh

## Run every test (what CI runs): the same commit gives the same result (fixed seeds; docs/testing.md).
test:
	scripts/test.sh

## The fast gate (under two minutes warm): strict build, swift format lint, the database-free suites.
check:
	scripts/check.sh

build:
	swift build

release:
	swift build -c release

clean:
	rm -rf .build

## Every benchmark in one run with its references (pgbench, openssl speed, the Go peer):
## a table with the goals, bench-results/bench.json and bench-results/bench.png.
bench:
	scripts/bench.sh

## Login benchmark: req/s, p50/p99, CPU/req, RSS; pgbench reference; A/B against the Go peer.
bench-login:
	scripts/bench-login.sh

## Two broker settings or builds against each other on repeat logins, interleaved (A_ENV, B_ENV, A_BIN, B_BIN).
bench-settings:
	scripts/bench-settings.sh

## Notification ingestion benchmark: notifications/s, p99, ratio to pgbench of the same work.
bench-notifications:
	scripts/bench-notifications.sh

## Deletion benchmark: deletions/s with 100 ms added to every revoke, against concurrency / latency.
bench-deletion:
	scripts/bench-deletion.sh

## Webhook delivery benchmark: backlog drain, paced event->delivery latency, pgbench on the claim.
bench-webhooks:
	scripts/bench-webhooks.sh

## OpenID Provider benchmark: code exchanges and userinfo per second and per CPU-second, against Glewlwyd 2.7.
bench-oidc:
	scripts/bench-oidc.sh

## Resilience suite: mixed load while PostgreSQL crashes, the broker is SIGKILLed twice, the
## simulator fails 30% of calls and a webhook receiver is down; then the invariants.
resilience:
	scripts/resilience.sh

## Fuzzing: each libFuzzer target for FUZZ_SECONDS (60) with AddressSanitizer and a random seed
## (make test runs a fixed seed and number of inputs instead).
fuzz:
	scripts/fuzz.sh

## API fuzzing: schemathesis with a random seed (printed, to replay a finding) and 100 examples
## per operation (make test runs the pinned cases and a fixed seed).
fuzz-api:
	scripts/fuzz-api.sh

## The Swift suites under ThreadSanitizer (one stage of make test).
tsan:
	scripts/test-tsan.sh
