#!/usr/bin/env python3
"""Every crate built in two versions (`cargo tree -d`) is explained in
docs/dependencies.md, whose text block lists them as `cargo tree` prints
them; a new duplicate, or an explanation whose duplicate left, fails."""
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

tree = subprocess.run(
    ["cargo", "tree", "-d", "-e", "normal", "--depth", "0", "--prefix", "none",
     "--format", "{p}", "--locked"],
    cwd=ROOT, check=True, capture_output=True, text=True,
).stdout
built = {line.replace(" (*)", "").strip() for line in tree.splitlines() if line.strip()}

doc = open(os.path.join(ROOT, "docs", "dependencies.md")).read()
block = re.search(r"```text\n(.*?)```", doc, re.S)
if not block:
    sys.exit("docs/dependencies.md: no ```text block listing the duplicates")
written = {line.strip() for line in block.group(1).splitlines() if line.strip()}

new = sorted(built - written)
gone = sorted(written - built)
if new or gone:
    if new:
        print("built twice but not explained in docs/dependencies.md:", *new, sep="\n  ")
    if gone:
        print("explained in docs/dependencies.md but no longer built twice:", *gone, sep="\n  ")
    sys.exit(1)
print(f"{len(built)} duplicate versions, each explained in docs/dependencies.md")
