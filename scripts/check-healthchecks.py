"""Runs the container healthchecks of docker-compose.yml and deploy/Dockerfile against a live
broker, the way Docker runs them in the runtime image (Debian slim, whose /bin/sh is dash):
CMD-SHELL tests through `dash -c`, CMD (exec form) tests directly, with the container's
BROKER_LISTEN (its port moved to the test broker's). Each must pass while the broker is up
and fail once it is stopped, so a healthcheck that can never pass (or never fail) is caught.

    check-healthchecks.py BIN_DIR BROKER_PORT up|down
"""
import os
import re
import shlex
import subprocess
import sys

import yaml

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
bin_dir, port, expected = sys.argv[1], sys.argv[2], sys.argv[3]


def in_image_path(text):
    """The image's binary paths, pointed at this build's binaries."""
    return text.replace("/usr/local/bin/", bin_dir + "/")


def with_port(listen):
    return re.sub(r":\d+$", ":" + port, listen)


checks = []  # (where, argv, BROKER_LISTEN)
compose = yaml.safe_load(open(os.path.join(root, "docker-compose.yml")))
broker = compose["services"]["broker"]
test = broker["healthcheck"]["test"]
checks.append(("docker-compose.yml broker", test, broker["environment"]["BROKER_LISTEN"]))
for name, service in compose["services"].items():
    if name != "broker" and service.get("image") == broker["image"] and not service.get("healthcheck", {}).get("disable"):
        sys.exit(f"docker-compose.yml {name}: runs the broker image, whose HEALTHCHECK is the broker's; disable it")

dockerfile = open(os.path.join(root, "deploy/Dockerfile")).read()
listen = re.search(r"^ENV BROKER_LISTEN=(\S+)", dockerfile, re.M).group(1)
match = re.search(r"^HEALTHCHECK .*?CMD (.+)$", dockerfile, re.M)
if not match:
    sys.exit("deploy/Dockerfile: no HEALTHCHECK")
command = match.group(1).strip()
checks.append(("deploy/Dockerfile", ["CMD", *yaml.safe_load(command)] if command.startswith("[") else ["CMD-SHELL", command], listen))

failures = []
for where, test, listen in checks:
    kind, rest = test[0], test[1:]
    if kind == "CMD-SHELL":
        argv = ["dash", "-c", in_image_path(rest[0])]
    elif kind == "CMD":
        argv = [in_image_path(word) for word in rest]
    else:
        failures.append(f"{where}: healthcheck test {test!r} is neither CMD nor CMD-SHELL")
        continue
    environment = {"PATH": "/usr/bin:/bin", "BROKER_LISTEN": with_port(listen)}
    result = subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=30)
    shown = " ".join(shlex.quote(a) for a in argv)
    passed = result.returncode == 0
    print(f"{where}: `{shown}` (BROKER_LISTEN={environment['BROKER_LISTEN']}) exit {result.returncode}, broker {expected}")
    if passed != (expected == "up"):
        failures.append(f"{where}: healthcheck exited {result.returncode} with the broker {expected}: {result.stderr.strip()}")

if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
