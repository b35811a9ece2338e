#!/usr/bin/env python3
"""Fails when a Rust file outgrows what one reader holds in mind.

Two limits, on the `.rs` files git tracks:
- 600 lines for a file under a crate's `src/`: a source file over that holds more than one
  thing, and splitting it by what each part holds (a store, its operator, its rows) makes the
  crate's `lib.rs` read as a table of contents;
- 1,000 lines for a file under a `tests/` directory (the `tests` crate at the root, or a
  crate's `tests/` and its subdirectories): a test file over that tests more than one
  behaviour, and splits by the behaviour it tests. The trybuild cases under a `tests/ui/` are
  left out: each is one misuse, and its length is the case's.

Lines are counted as `wc -l` counts them. Usage: scripts/check-file-sizes.py; exit status 1
with each file over its limit, its line count and the limit.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_LIMIT = 600
TEST_LIMIT = 1000


def limit(path):
    """The limit of the tracked file `path` (relative, `/`-separated), or None."""
    dirs = path.split("/")[:-1]
    # The outermost of the two decides: `tests/` inside a `src/` holds unit tests of a source
    # module, and a `src/` inside a `tests/` is a fixture crate of the tests.
    for i, name in enumerate(dirs):
        if name == "src":
            return SOURCE_LIMIT
        if name == "tests":
            return None if dirs[i + 1 : i + 2] == ["ui"] else TEST_LIMIT
    return None


def lines(path):
    with open(os.path.join(ROOT, path), "rb") as f:
        return f.read().count(b"\n")


def main():
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.rs"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode("utf-8")
    over = []
    checked = 0
    for path in filter(None, tracked.split("\0")):
        most = limit(path)
        # A file deleted in the working tree but not yet in the index is not there to count.
        if most is None or not os.path.exists(os.path.join(ROOT, path)):
            continue
        checked += 1
        count = lines(path)
        if count > most:
            over.append((count, most, path))
    for count, most, path in sorted(over, key=lambda o: o[2]):
        kind = "source" if most == SOURCE_LIMIT else "test"
        print(f"{path}: {count} lines, over the {most}-line limit of a {kind} file")
    if over:
        print(
            f"{len(over)} of {checked} files over their limit: split each by what its parts "
            "hold (a test file by the behaviour each part tests)"
        )
        return 1
    print(
        f"{checked} files within their limits ({SOURCE_LIMIT} lines under src/, "
        f"{TEST_LIMIT} under tests/)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
