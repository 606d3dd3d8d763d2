"""Cross-checks deploy/ and docker-compose.yml against the code and docs/configuration.md.

- every environment variable given to the broker is one BrokerConfiguration reads (a
  NAME_FILE variable counts as NAME) and one the configuration table (docs/configuration.md) documents;
- every Deployment probes /readyz (readiness) and /healthz (liveness), runs as non-root with
  resource requests, and mounts the Secrets the ConfigMap points at;
- every Secret and ConfigMap a Deployment refers to is defined (the CloudNativePG app Secret
  is made by the operator from the Cluster);
- /metrics has its own port (BROKER_METRICS_LISTEN) on every Deployment, the NetworkPolicy
  admits it only from a namespace selector, and the PodMonitor scrapes that port by name;
- the PrometheusRule in monitoring/ is what scripts/make-prometheus-rule.py makes of alerts.yml;
- and the other way round: every setting the broker reads is documented there.
"""
import glob
import pathlib
import re
import sys

import yaml

root = pathlib.Path(__file__).resolve().parent.parent
# What the broker reads: its product modules and its command line.
source = "\n".join(
    p.read_text() for folder in ("BrokerCore", "AppleID", "appleid-broker") for p in (root / "Sources" / folder).rglob("*.swift"))
# The configuration table lives in docs/configuration.md (linked from the README).
readme = (root / "docs/configuration.md").read_text()
failures = []


file_backed = re.search(r"fileBackedNames = \[([^\]]*)\]", source).group(1)


def check_variable(name, where):
    base = name[: -len("_FILE")] if name.endswith("_FILE") else name
    if name.endswith("_FILE") and f'"{base}"' not in file_backed:
        failures.append(f"{where}: {name}: only {file_backed} may come from a file")
    if f'"{base}"' not in source:
        failures.append(f"{where}: {name} is not a setting the broker reads")
    if f"`{base}`" not in readme and f"`{name}`" not in readme:
        failures.append(f"{where}: {name} is not documented in docs/configuration.md")


documents = []
for path in sorted(glob.glob(str(root / "deploy/kubernetes/*.yaml"))):
    for document in yaml.safe_load_all(open(path)):
        if document:
            documents.append((pathlib.Path(path).name, document))

kinds = {}
for name, document in documents:
    kinds.setdefault(document["kind"], []).append(document)
defined_secrets = {d["metadata"]["name"] for d in kinds.get("Secret", [])}
defined_secrets |= {d["metadata"]["name"] + "-app" for d in kinds.get("Cluster", [])}
config_maps = {d["metadata"]["name"]: d for d in kinds.get("ConfigMap", [])}

for config_map in config_maps.values():
    for variable in config_map["data"]:
        check_variable(variable, f"ConfigMap {config_map['metadata']['name']}")

deployments = kinds.get("Deployment", [])
if len(deployments) < 1:
    failures.append("no Deployment in deploy/kubernetes")
for deployment in deployments:
    where = f"Deployment {deployment['metadata']['name']}"
    spec = deployment["spec"]["template"]["spec"]
    if not spec.get("securityContext", {}).get("runAsNonRoot"):
        failures.append(f"{where}: does not require runAsNonRoot")
    mounted = {v["name"]: v.get("secret", {}).get("secretName") for v in spec.get("volumes", [])}
    for secret in filter(None, mounted.values()):
        if secret not in defined_secrets:
            failures.append(f"{where}: mounts Secret {secret}, which nothing defines")
    for container in spec["containers"]:
        if container.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/readyz":
            failures.append(f"{where}: readiness probe is not GET /readyz")
        if container.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz":
            failures.append(f"{where}: liveness probe is not GET /healthz")
        requests = container.get("resources", {}).get("requests", {})
        if "cpu" not in requests or "memory" not in requests:
            failures.append(f"{where}: no cpu and memory requests")
        for variable in container.get("env", []):
            check_variable(variable["name"], where)
            reference = variable.get("valueFrom", {}).get("secretKeyRef")
            if reference and reference["name"] not in defined_secrets:
                failures.append(f"{where}: reads Secret {reference['name']}, which nothing defines")
        for source_ref in container.get("envFrom", []):
            name = source_ref.get("configMapRef", {}).get("name")
            if name and name not in config_maps:
                failures.append(f"{where}: reads ConfigMap {name}, which nothing defines")
        # Paths the ConfigMap names must be inside a mounted volume.
        mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
        for config_map in config_maps.values():
            for variable, value in config_map["data"].items():
                if variable.endswith(("_PATH", "_FILE")) and not any(str(value).startswith(m + "/") for m in mounts):
                    failures.append(f"{where}: {variable}={value} is not under a mounted volume")
        args = container.get("args", [])
        if "--roles" in args:
            roles = args[args.index("--roles") + 1].split(",")
            for role in roles:
                if role not in ("api", "notifications", "deletion", "dispatch", "sweep"):
                    failures.append(f"{where}: unknown role {role}")

covered = set()
for deployment in deployments:
    args = deployment["spec"]["template"]["spec"]["containers"][0].get("args", [])
    if "--roles" in args:
        covered |= set(args[args.index("--roles") + 1].split(","))
    else:
        covered |= {"api", "notifications", "deletion", "dispatch", "sweep"}
missing_roles = {"api", "notifications", "deletion", "dispatch", "sweep"} - covered
if missing_roles:
    failures.append(f"no Deployment runs the roles {sorted(missing_roles)}")

compose = yaml.safe_load(open(root / "docker-compose.yml"))
for variable in compose["services"]["broker"]["environment"]:
    check_variable(variable, "docker-compose.yml broker")
for line in (root / "deploy/Dockerfile").read_text().splitlines():
    match = re.match(r"ENV (\w+)=", line)
    if match:
        check_variable(match.group(1), "deploy/Dockerfile")

for name in sorted(set(re.findall(r'"((?:BROKER|APPLE|DATABASE|TOKEN|POSTGRES)_[A-Z_]+)"', source))):
    if f"`{name}`" not in readme:
        failures.append(f"docs/configuration.md: the setting {name} is read by the broker but not documented")

metrics_listen = next((c["data"].get("BROKER_METRICS_LISTEN") for c in config_maps.values()), None)
if not metrics_listen:
    failures.append("ConfigMap: BROKER_METRICS_LISTEN is not set (metrics would share the API's port)")
else:
    metrics_port = int(metrics_listen.rsplit(":", 1)[1])
    for deployment in deployments:
        ports = {p.get("name"): p["containerPort"] for p in deployment["spec"]["template"]["spec"]["containers"][0].get("ports", [])}
        if ports.get("metrics") != metrics_port:
            failures.append(f"Deployment {deployment['metadata']['name']}: no container port `metrics` = {metrics_port}")
    for policy in kinds.get("NetworkPolicy", []):
        for rule in policy["spec"].get("ingress", []):
            if any(p["port"] == metrics_port for p in rule.get("ports", [])):
                sources = rule.get("from", [])
                if not sources or not all("namespaceSelector" in s for s in sources):
                    failures.append(f"NetworkPolicy {policy['metadata']['name']}: port {metrics_port} is open beyond a namespace")
monitors = [d for path in sorted((root / "deploy/kubernetes/monitoring").glob("*.yaml")) for d in yaml.safe_load_all(open(path)) if d]
for monitor in [m for m in monitors if m.get("kind") == "PodMonitor"]:
    if [e.get("port") for e in monitor["spec"]["podMetricsEndpoints"]] != ["metrics"]:
        failures.append("PodMonitor: must scrape the `metrics` port")
if not any(m.get("kind") == "PodMonitor" for m in monitors) or not any(m.get("kind") == "PrometheusRule" for m in monitors):
    failures.append("deploy/kubernetes/monitoring: a PodMonitor and a PrometheusRule are expected")
import subprocess
if subprocess.run([sys.executable, str(root / "scripts/make-prometheus-rule.py"), "--check"]).returncode != 0:
    failures.append("deploy/kubernetes/monitoring/prometheusrule.yaml is stale")

if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
print(f"deployment files agree with the code and docs/configuration.md ({len(documents)} manifests, {len(deployments)} Deployments)")
