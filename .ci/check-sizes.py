#!/usr/bin/env python3
"""No source file over 700 lines of code: blank lines, comments and test
code (`#[cfg(test)]` items, `tests.rs`, `src/testing.rs`-style fixtures are
still counted) are left out. Prints the largest files; exits 1 if one is over.

Usage: python3 .ci/check-sizes.py [src] [--limit N]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from importlib import import_module

modules = import_module("check-modules")

LIMIT = 700


def lines_of_code(path):
    code = modules.drop_test_items(modules.strip(open(path, encoding="utf-8").read()))
    return sum(1 for line in code.splitlines() if line.strip())


def main():
    args = sys.argv[1:]
    limit = LIMIT
    if "--limit" in args:
        i = args.index("--limit")
        limit = int(args[i + 1])
        del args[i : i + 2]
    root = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "src")
    sizes = []
    for d, _, names in os.walk(root):
        for name in names:
            if name.endswith(".rs") and name != "tests.rs":
                path = os.path.join(d, name)
                sizes.append((lines_of_code(path), os.path.relpath(path, root)))
    sizes.sort(reverse=True)
    over = [(n, p) for n, p in sizes if n > limit]
    for n, p in sizes[:8]:
        print(f"{n:6} {p}")
    for n, p in over:
        print(f"{p}: {n} lines of code, over {limit}", file=sys.stderr)
    if over:
        sys.exit(1)
    print(f"{len(sizes)} files, none over {limit} lines of code")


if __name__ == "__main__":
    main()
