#!/usr/bin/env python3
"""Every target declares what it imports: a module of this package that a target's Swift files
import must be among the target's own dependencies in Package.swift, not reached only through
another dependency (issue 37). SwiftPM's `--explicit-target-dependency-import-check error` does
this on macOS but reports nothing on Linux (swiftlang/swift#70560), so this script does it from
`swift package dump-package`: it reads each target's `import` lines (plain, `@testable`,
`@_exported`, access-level, and `import struct M.T` forms) and fails with the list of
undeclared ones. Modules from outside the package (Foundation, Glibc, Testing, …) are not its
concern. Usage: scripts/check-imports.py [--package-json FILE]"""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPORT = re.compile(
    r"^\s*(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:public|package|internal|fileprivate|private)\s+)?"
    r"import\s+(?:(?:typealias|struct|class|enum|protocol|let|var|func)\s+)?([A-Za-z_][A-Za-z0-9_]*)")


def package_description(argv):
    if "--package-json" in argv:
        with open(argv[argv.index("--package-json") + 1], encoding="utf-8") as handle:
            return json.load(handle)
    output = subprocess.run(
        ["swift", "package", "dump-package"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return json.loads(output)


def target_folder(target):
    if target.get("path"):
        return target["path"]
    return os.path.join("Tests" if target["type"] == "test" else "Sources", target["name"])


def declared(target):
    names = set()
    for dependency in target["dependencies"]:
        for kind in ("byName", "target", "product"):
            if kind in dependency and dependency[kind]:
                names.add(dependency[kind][0])
    return names


def main(argv):
    package = package_description(argv)
    modules = {target["name"].replace("-", "_") for target in package["targets"]}
    undeclared = []
    for target in package["targets"]:
        folder = os.path.join(ROOT, target_folder(target))
        if target["type"] in ("system", "binary", "plugin") or not os.path.isdir(folder):
            continue
        allowed = {name.replace("-", "_") for name in declared(target)} | {target["name"].replace("-", "_")}
        for directory, _, files in os.walk(folder):
            for name in sorted(files):
                if not name.endswith(".swift"):
                    continue
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as handle:
                    for number, line in enumerate(handle, 1):
                        match = IMPORT.match(line)
                        if match and match.group(1) in modules and match.group(1) not in allowed:
                            undeclared.append(
                                f"{os.path.relpath(path, ROOT)}:{number}: {target['name']} imports {match.group(1)}"
                                " without declaring it a dependency")
    if undeclared:
        print("check-imports: a target imports a module it does not declare (add it to its dependencies in"
              " Package.swift):", file=sys.stderr)
        print("\n".join(undeclared), file=sys.stderr)
        return 1
    print(f"check-imports: every import of {len(package['targets'])} targets is a declared dependency")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
