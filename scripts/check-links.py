#!/usr/bin/env python3
"""Every relative link in every tracked Markdown file points at a file that exists, and a
`#anchor` at a heading of that file (GitHub's slugs), so that the maps in README.md,
CONTRIBUTING.md and docs/ stay true when a document moves.

Markdown that rustdoc includes (`include_str!("….md")`, the `.md` files under a crate's `src/`)
becomes part of a docs.rs page, where a relative file link points at nothing: there, any relative
link to a file is reported, and an absolute URL or an intra-doc link is the fix. Links with a scheme (`https:`, `mailto:`), rustdoc's intra-doc links (`[`Task`]`,
`(idempotask::Task)`: no `/`, no `.md`, no `#` first) and links inside code are left alone.

Usage: scripts/check-links.py [FILE.md ...]   (default: `git ls-files '*.md'`)
Exits 1 and prints `file:line: link: why` for each broken link.
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# [text](target) and [text](target "title"); reference definitions `[name]: target`.
INLINE = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```+|~~~+)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def lines_outside_code(text):
    """Yields (line number, line) for the lines outside fenced blocks, code spans blanked."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        found = FENCE.match(line)
        if found:
            marker = found.group(1)
            if fence is None:
                fence = marker
                continue
            if marker.startswith(fence[0]) and len(marker) >= len(fence):
                fence = None
                continue
        if fence is None:
            yield number, CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def slug(heading):
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to `-`."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    heading = heading.replace("`", "").strip().lower()
    heading = re.sub(r"[^\w\- ]", "", heading)
    return heading.replace(" ", "-")


ANCHORS = {}


def anchors(path):
    if path not in ANCHORS:
        seen, found = {}, set()
        with open(path, encoding="utf-8") as file:
            text = file.read()
        fence = None
        for line in text.splitlines():
            marker = FENCE.match(line)
            if marker:
                fence = None if fence else marker.group(1)
                continue
            heading = HEADING.match(line) if fence is None else None
            if heading:
                base = slug(heading.group(2))
                count = seen.get(base, 0)
                seen[base] = count + 1
                found.add(base if count == 0 else f"{base}-{count}")
        ANCHORS[path] = found
    return ANCHORS[path]


def is_relative_file_link(target):
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
        return False  # https:, mailto:, …
    if target.startswith("#"):
        return True
    path = target.split("#", 1)[0]
    # Intra-doc links (`idempotask::Task`, `Idempotency::methods`) have no `/` and no extension.
    return "/" in path or path.endswith(".md") or "." in os.path.basename(path)


def included_by_rustdoc(md):
    """Whether `md` is a crate's own documentation: a `.md` file under a `src/` folder."""
    return "src" in os.path.normpath(md).split(os.sep)[:-1]


def check(md):
    broken = []
    with open(md, encoding="utf-8") as file:
        text = file.read()
    for number, line in lines_outside_code(text):
        targets = INLINE.findall(line)
        reference = REFERENCE.match(line)
        if reference:
            targets.append(reference.group(1))
        for target in targets:
            if not is_relative_file_link(target):
                continue
            path, _, anchor = target.partition("#")
            if path and included_by_rustdoc(md):
                broken.append(f"{md}:{number}: {target}: a relative link in docs rustdoc includes")
                continue
            resolved = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
            if not os.path.exists(resolved):
                broken.append(f"{md}:{number}: {target}: no such file")
            elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                broken.append(f"{md}:{number}: {target}: no heading #{anchor} in {os.path.relpath(resolved, ROOT)}")
    return broken


def main():
    os.chdir(ROOT)
    files = sys.argv[1:] or subprocess.run(
        ["git", "ls-files", "--", "*.md"], check=True, capture_output=True, text=True
    ).stdout.split()
    broken = [line for md in files for line in check(md)]
    for line in broken:
        print(line)
    print(f"check-links: {len(files)} files, {len(broken)} broken links", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
