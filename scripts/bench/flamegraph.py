"""Folds `perf script` output into one line per stack and draws it as a flame graph (SVG).

    perf script -i perf.data | python3 flamegraph.py --folded out.folded --svg out.svg \
        [--title T] [--top N] [--demangle /path/to/swift-demangle]

Stack folding and drawing are a few lines of our own (Brendan Gregg's FlameGraph scripts are
in no Debian package): every sample's frames, root first, joined by `;`, counted; a frame's
width is its share of the samples. Swift symbols are demangled (`swift demangle --simplified`)
when the toolchain's demangler is given. `--top N` prints the N functions with the most
samples on their own (self) and anywhere on the stack (total), to stdout.
"""

import argparse
import collections
import html
import re
import subprocess
import sys

# `perf script` prints a header line per sample, then one line per frame:
#   <tab>  7f12ab34 symbol+0x1c (/path/to/dso)
FRAME = re.compile(r"^\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)$")


def fold(lines):
    stacks = collections.Counter()
    frames = []
    command = None
    for line in lines:
        if not line.strip():
            if frames:
                stacks[";".join([command] + list(reversed(frames)))] += 1
            frames, command = [], None
            continue
        if not line.startswith((" ", "\t")):
            command = line.split()[0] if line.split() else "?"
            continue
        match = FRAME.match(line)
        if not match:
            continue
        symbol, dso = match.groups()
        symbol = re.sub(r"\+0x[0-9a-f]+$", "", symbol)
        if symbol == "[unknown]":
            symbol = "[" + dso.rsplit("/", 1)[-1] + "]"
        frames.append(symbol.replace(";", ":"))
    if frames:
        stacks[";".join([command] + list(reversed(frames)))] += 1
    return stacks


def demangle(stacks, tool):
    if not tool:
        return stacks
    keys = list(stacks)
    text = "\n".join(keys) + "\n"
    try:
        out = subprocess.run([tool, "--simplified"], input=text, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return stacks
    lines = out.rstrip("\n").split("\n")
    if len(lines) != len(keys):
        return stacks
    result = collections.Counter()
    for key, line in zip(keys, lines):
        result[line] += stacks[key]
    return result


def tree(stacks):
    root = {"name": "all", "count": 0, "children": {}}
    for stack, count in stacks.items():
        node = root
        root["count"] += count
        for frame in stack.split(";"):
            node = node["children"].setdefault(frame, {"name": frame, "count": 0, "children": {}})
            node["count"] += count
    return root


def color(name):
    # Warm colours as in the original flame graphs, stable per name; our own code (Swift
    # modules of the broker) a little greener so it stands out from libraries and the kernel.
    digest = sum(ord(c) * (i + 1) for i, c in enumerate(name[:40]))
    if name.startswith("[") or "kernel" in name:
        return f"rgb({200 + digest % 55},{90 + digest % 60},{60 + digest % 30})"
    if any(part in name for part in ("BrokerCore", "BrokerAPI", "HTTPServer", "PostgresClient", "JOSE", "AppleID",
                                     "StrictJSON", "Observability", "BrokerCrypto", "Locking")):
        return f"rgb({120 + digest % 60},{190 + digest % 50},{80 + digest % 40})"
    return f"rgb({225 + digest % 30},{110 + digest % 110},{40 + digest % 50})"


def svg(root, title, width=1400, row=16):
    total = max(1, root["count"])
    rects = []
    depth_max = 0

    def walk(node, x, depth):
        nonlocal depth_max
        depth_max = max(depth_max, depth)
        w = node["count"] / total * width
        if w < 0.2:
            return
        rects.append((x, depth, w, node["name"], node["count"]))
        child_x = x
        for child in sorted(node["children"].values(), key=lambda c: c["name"]):
            walk(child, child_x, depth + 1)
            child_x += child["count"] / total * width

    walk(root, 0.0, 0)
    height = (depth_max + 3) * row + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="monospace" font-size="11">',
           '<rect width="100%" height="100%" fill="#fdfdf6"/>',
           f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="15">{html.escape(title)}</text>']
    for x, depth, w, name, count in rects:
        y = height - (depth + 1) * row - 10
        label = f"{name} ({count} samples, {100.0 * count / total:.1f}%)"
        out.append(f'<g><title>{html.escape(label)}</title>'
                   f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 1}" fill="{color(name)}" rx="1"/>')
        chars = int(w / 7)
        if chars >= 3:
            text = name if len(name) <= chars else name[:max(1, chars - 2)] + ".."
            out.append(f'<text x="{x + 2:.1f}" y="{y + row - 4}">{html.escape(text)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def top(stacks, n):
    own = collections.Counter()
    anywhere = collections.Counter()
    total = sum(stacks.values())
    for stack, count in stacks.items():
        frames = stack.split(";")
        own[frames[-1]] += count
        for frame in set(frames[1:]):
            anywhere[frame] += count
    print(f"{total} samples; the {n} functions with the most samples of their own (self) and on the stack (total):")
    for name, count in own.most_common(n):
        print(f"  self {100.0 * count / total:5.1f}%  total {100.0 * anywhere[name] / total:5.1f}%  {name[:150]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--folded")
    parser.add_argument("--svg")
    parser.add_argument("--title", default="flame graph")
    parser.add_argument("--top", type=int, default=0)
    parser.add_argument("--demangle")
    args = parser.parse_args()
    stacks = demangle(fold(sys.stdin), args.demangle)
    if args.folded:
        with open(args.folded, "w") as handle:
            for stack, count in sorted(stacks.items()):
                handle.write(f"{stack} {count}\n")
    if args.svg:
        with open(args.svg, "w") as handle:
            handle.write(svg(tree(stacks), args.title))
    if args.top:
        top(stacks, args.top)


if __name__ == "__main__":
    main()
