# The test targets that need no PostgreSQL: `make check` runs them, and `make test` runs them
# beside the integration targets. A target belongs here when none of its tests starts a cluster
# (a rule test, a parser, vectors, a route through the router, a server or simulator on loopback).
# Sourced; sets DATABASE_FREE_SUITES (a swift test --filter).
DATABASE_FREE_SUITES="AppleIDTests|WorkersTests|BrokerRuleTests|StrictJSONTests|JOSETests|BrokerCryptoTests|HTTPServerTests|AppleSimulatorTests"
