"""Writes deploy/kubernetes/monitoring/prometheusrule.yaml from deploy/prometheus/alerts.yml.

The alert rules have one source, alerts.yml (tested with promtool); prometheus-operator
users get the same groups wrapped in a PrometheusRule. `--check` exits 1 when the file on
disk is not what this would write (check-deploy.py runs it).
"""
import pathlib
import sys

import yaml

root = pathlib.Path(__file__).resolve().parent.parent
source = root / "deploy/prometheus/alerts.yml"
target = root / "deploy/kubernetes/monitoring/prometheusrule.yaml"

rules = yaml.safe_load(source.read_text())
document = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PrometheusRule",
    "metadata": {"name": "appleid-broker", "labels": {"app.kubernetes.io/name": "appleid-broker"}},
    "spec": {"groups": rules["groups"]},
}
text = (
    "# Generated from deploy/prometheus/alerts.yml by scripts/make-prometheus-rule.py: edit that file.\n"
    + yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=1000)
)
if "--check" in sys.argv:
    if not target.exists() or target.read_text() != text:
        print(f"{target.relative_to(root)} differs from {source.relative_to(root)}: run python3 scripts/make-prometheus-rule.py")
        sys.exit(1)
else:
    target.write_text(text)
