#!/usr/bin/env bash
# Checks the deployment files against what they describe: Kubernetes manifests against the
# Kubernetes API schemas (kubernetes-validate, strict), the alert rules with promtool, and
# every setting the manifests and docker-compose.yml pass against the configuration the
# broker reads and the README documents; then runs the container healthchecks against a live
# broker as the runtime image runs them (dash). Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/tools-venv.sh
source scripts/lib/tools-venv.sh

echo "== Kubernetes manifests (kubernetes-validate --strict, Kubernetes 1.30)" >&2
# Kustomization and the CloudNativePG Cluster have no schema there: they are only warned about.
"$TOOLS_VENV/bin/kubernetes-validate" --strict --kubernetes-version 1.30.0 --quiet deploy/kubernetes/*.yaml

echo "== alert rules (promtool)" >&2
promtool check rules deploy/prometheus/alerts.yml
promtool test rules deploy/prometheus/alerts.test.yml

echo "== settings in the deployment files" >&2
"$TOOLS_VENV/bin/python" scripts/check-deploy.py

echo "== container healthchecks against a live broker, as the runtime image runs them (dash)" >&2
BIN=${BROKER_BIN:-$(swift build --show-bin-path)}
[ -x "$BIN/appleid-broker" ] && [ -x "$BIN/apple-sim" ] || swift build >&2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/appleid-broker-healthcheck.XXXXXX")
# shellcheck source=lib/stack.sh
source scripts/lib/stack.sh
trap 'stop_all; rm -rf "$WORK"' EXIT
start_stack
"$TOOLS_VENV/bin/python" scripts/check-healthchecks.py "$BIN" "$BROKER_PORT" up
kill -TERM "$BROKER_PID" && wait "$BROKER_PID" || true
BROKER_PID=
"$TOOLS_VENV/bin/python" scripts/check-healthchecks.py "$BIN" "$BROKER_PORT" down
