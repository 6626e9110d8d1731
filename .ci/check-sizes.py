#!/usr/bin/env python3
"""No source file over 700 lines of code, and no function over 70: blank
lines, comments and test code are left out. For files, test code is
`#[cfg(test)]` items and `tests.rs` (`src/testing.rs`-style fixtures are
still counted); for functions, also files under a `tests/` or
`golden_tests/` directory and `#[test]` / `#[tokio::test]` functions. A
function is measured from its `fn` line to its closing brace; a nested
function counts toward the outer one and is also measured on its own. The
codec tables named in FN_ALLOWED are exempt. Prints the largest files and
functions; exits 1 if one is over.

Usage: python3 .ci/check-sizes.py [src] [--limit N] [--fn-limit N]
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
from importlib import import_module

modules = import_module("check-modules")

LIMIT = 700
FN_LIMIT = 70

# Codec tables: one match arm per record kind or checkpoint chunk kind, so
# they grow with the format, not with what one arm does.
FN_ALLOWED = {
    ("spool/record.rs", "encode"),
    ("spool/record.rs", "decode"),
    ("spool/checkpoint/encode.rs", "encode_chunks"),
    ("spool/checkpoint/decode.rs", "decode_chunk"),
}

FN = re.compile(r"\bfn\s+(\w+)")
TEST_ATTR = re.compile(r"#\[\s*(?:tokio\s*::\s*)?test\b")


def code_of(path):
    return modules.drop_test_items(modules.strip(open(path, encoding="utf-8").read()))


def count_lines(code):
    return sum(1 for line in code.splitlines() if line.strip())


def functions(code):
    """(name, lines of code) of each function with a body, tests left out."""
    for m in FN.finditer(code):
        # The item's attributes and qualifiers: back to the end of the one before.
        before = max(code.rfind(c, 0, m.start()) for c in ";{}")
        if TEST_ATTR.search(code, before + 1, m.start()):
            continue
        depth, i = 0, m.end()
        while i < len(code) and not (depth == 0 and code[i] in "{;"):
            depth += code[i] in "(["
            depth -= code[i] in ")]"
            i += 1
        if i == len(code) or code[i] == ";":
            continue  # a declaration: no body
        depth = 0
        for j in range(i, len(code)):
            depth += code[j] == "{"
            depth -= code[j] == "}"
            if depth == 0:
                break
        start = code.rfind("\n", 0, m.start()) + 1
        yield m.group(1), count_lines(code[start : j + 1])


def is_test_file(rel):
    parts = rel.split(os.sep)
    return parts[-1] == "tests.rs" or any(p in ("tests", "golden_tests") for p in parts[:-1])


def main():
    args = sys.argv[1:]
    limit, fn_limit = LIMIT, FN_LIMIT
    if "--limit" in args:
        i = args.index("--limit")
        limit = int(args[i + 1])
        del args[i : i + 2]
    if "--fn-limit" in args:
        i = args.index("--fn-limit")
        fn_limit = int(args[i + 1])
        del args[i : i + 2]
    root = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "src")
    sizes, fns = [], []
    for d, _, names in os.walk(root):
        for name in names:
            if name.endswith(".rs") and name != "tests.rs":
                path = os.path.join(d, name)
                rel = os.path.relpath(path, root)
                code = code_of(path)
                sizes.append((count_lines(code), rel))
                if not is_test_file(rel):
                    key = rel.replace(os.sep, "/")
                    fns.extend((n, key, f) for f, n in functions(code) if (key, f) not in FN_ALLOWED)
    sizes.sort(reverse=True)
    fns.sort(reverse=True)
    over = [(n, p) for n, p in sizes if n > limit]
    fns_over = [(n, p, f) for n, p, f in fns if n > fn_limit]
    for n, p in sizes[:8]:
        print(f"{n:6} {p}")
    print()
    for n, p, f in fns[:8]:
        print(f"{n:6} {p}:{f}")
    for n, p in over:
        print(f"{p}: {n} lines of code, over {limit}", file=sys.stderr)
    for n, p, f in fns_over:
        print(f"{p}: fn {f}: {n} lines, over {fn_limit}", file=sys.stderr)
    if over or fns_over:
        sys.exit(1)
    print(f"{len(sizes)} files, none over {limit} lines of code; {len(fns)} functions, none over {fn_limit}")


if __name__ == "__main__":
    main()
