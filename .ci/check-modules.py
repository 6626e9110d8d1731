#!/usr/bin/env python3
"""The module graph is one-way: under every module, its child modules may
use each other only along a DAG (no import circles), and the same for the
crate's top-level modules.

An edge runs from the module a path is written in to the module it names
(`crate::…`, `super::…`, `self::…`, in `use` items and in code), cut at
the children of the two modules' nearest common ancestor. A child using its
parent, or a parent its child, is not an edge: that is how a module and its
rooms talk. Test code (`#[cfg(test)]` items and `tests.rs` files) is left
out. Prints each circle and exits 1 if there is one.

Errors are types, not text: at most STRING_ERRORS_MAX lines of src may
match `Result<…, String>`, counted as `grep -rn "Result<[^;]*, String>"
src` counts them (every file, line by line, test code included). Prints
the lines and exits 1 when there are more.

Usage: python3 .ci/check-modules.py [src]   (`--graph` prints the edges)
"""

import os
import re
import sys
from collections import defaultdict


def module_of(path, root):
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel in (["lib"], ["main"]):
        return ()
    if rel[-1] == "mod":
        rel = rel[:-1]
    return tuple(rel)


def strip(text):
    """Comments, strings and chars out, so that braces and paths are code."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            out.append('""')
            i = n if end < 0 else end + 1 + len(hashes)
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            out.append('""')
            i += 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x[0-9a-fA-F]{2}'", text[i:i + 12]):
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x[0-9a-fA-F]{2}'", text[i:i + 12])
            out.append("' '")
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_items(code):
    """Removes `#[cfg(test)]` items (a block or up to `;`)."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]", code)
        if not m:
            return code
        i = m.end()
        brace = code.find("{", i)
        semi = code.find(";", i)
        if semi >= 0 and (brace < 0 or semi < brace):
            code = code[: m.start()] + code[semi + 1:]
            continue
        depth, j = 0, brace
        while j < len(code):
            if code[j] == "{":
                depth += 1
            elif code[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        code = code[: m.start()] + code[j + 1:]


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        return [tree]
    prefix, inner = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p:
            out.extend(expand_use(prefix + p))
    return out


def paths_in(code):
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        paths.extend(expand_use(m.group(1)))
    rest = re.sub(r"\buse\s+[^;]+;", "", code)
    paths.extend(m.group(0) for m in re.finditer(r"\b(?:crate|super|self)(?:::\w+)+", rest))
    return paths


def resolve(path, here, modules):
    parts = [p for p in path.split("::") if p]
    if not parts:
        return None
    if parts[0] == "crate":
        base, parts = (), parts[1:]
    elif parts[0] in ("super", "self"):
        base = list(here)
        while parts and parts[0] in ("super", "self"):
            if parts[0] == "super":
                base = base[:-1]
            parts = parts[1:]
        base = tuple(base)
    else:
        return None
    target = base
    for p in parts:
        if target + (p,) in modules:
            target = target + (p,)
        else:
            break
    return target


# The `Result<_, String>` lines src may keep (issue 42, point 6): each is
# where text really is the best type (a wire format, a test helper, an
# answer's body at the edge), not a way around an error enum.
STRING_ERRORS_MAX = 5
STRING_ERROR = re.compile(r"Result<[^;]*, String>")


def string_errors(root):
    """`path:line: text` of each line under `root` that `grep -rn
    "Result<[^;]*, String>"` prints."""
    found = []
    for d, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(d, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    if STRING_ERROR.search(line):
                        found.append(f"{os.path.normpath(path)}:{n}: {line.strip()}")
    return found


def check_string_errors(root):
    """False (after printing them) when more than STRING_ERRORS_MAX lines
    make an error a String."""
    found = string_errors(root)
    if len(found) > STRING_ERRORS_MAX:
        print(
            f"{len(found)} lines match `Result<…, String>`, allowed at most "
            f"{STRING_ERRORS_MAX}: give these errors a type (a thiserror enum, or a "
            "struct when one message kind suffices)"
        )
        for line in found:
            print(f"    {line}")
        return False
    print(f"string errors: {len(found)} `Result<…, String>` lines, at most {STRING_ERRORS_MAX}")
    return True


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "src")
    files = {}
    for d, _, names in os.walk(root):
        for name in names:
            if name.endswith(".rs") and name != "tests.rs" and not name.endswith("_tests.rs"):
                path = os.path.join(d, name)
                if os.path.relpath(path, root) == "main.rs":
                    continue
                files[module_of(path, root)] = path
    modules = set(files)
    # Under each parent, edges among its children.
    graphs = defaultdict(lambda: defaultdict(set))
    why = {}
    for here, path in sorted(files.items()):
        code = drop_test_items(strip(open(path, encoding="utf-8").read()))
        for p in paths_in(code):
            there = resolve(p, here, modules)
            if there is None or there == here:
                continue
            common = 0
            while common < min(len(here), len(there)) and here[common] == there[common]:
                common += 1
            if common == len(here) or common == len(there):
                continue  # ancestor and descendant
            parent = here[:common]
            a, b = here[common], there[common]
            graphs[parent][a].add(b)
            why.setdefault((parent, a, b), f"{path}: {p}")
    if "--graph" in sys.argv:
        for parent, g in sorted(graphs.items()):
            for a, bs in sorted(g.items()):
                print("::".join(("crate",) + parent), ":", a, "->", ", ".join(sorted(bs)))
    circles = []
    for parent, g in sorted(graphs.items()):
        for cycle in find_cycles(g):
            circles.append((parent, cycle))
    for parent, cycle in circles:
        name = "::".join(("crate",) + parent)
        print(f"import circle under {name}: " + " -> ".join(cycle + [cycle[0]]))
        for a, b in zip(cycle, cycle[1:] + [cycle[0]]):
            print(f"    {a} -> {b}: {why[(parent, a, b)]}")
    strings_ok = check_string_errors(root)
    if circles or not strings_ok:
        sys.exit(1)
    print(f"module graph: {len(files)} modules, no import circle")


def find_cycles(g):
    """One cycle per strongly connected component with more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    nodes = sorted(set(g) | {b for bs in g.values() for b in bs})

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(shortest_cycle(g, sorted(comp)))

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def shortest_cycle(g, comp):
    start = comp[0]
    inside = set(comp)
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(g.get(v, ())):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path))
                if w in inside and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


if __name__ == "__main__":
    sys.setrecursionlimit(10000)
    main()
