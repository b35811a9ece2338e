#!/usr/bin/env python3
"""Fails when the file modules of a crate import each other in a loop.

What `cargo modules dependencies --acyclic` checks, without building rust-analyzer (the
`cargo-modules` crate needs a newer rustc than this toolchain and is slow to build): for each
crate's `src/`, a graph whose nodes are the files (`lib.rs`/`main.rs`, `a.rs`, `a/mod.rs`,
`a/b.rs`) and whose edges are the paths a file names, then every strongly connected component
of more than one file is printed as a cycle.

The rules, each the honest reading of "this file needs that one":
- An edge is a path in code, in a `use` tree or in an expression: `crate::a::B`, `super::B`,
  `self::child::B`, or `child::B` for a child module the file declares. Comments, doc comments
  (intra-doc links are not dependencies), strings and `#[cfg(test)]` modules are left out, as
  `cargo modules` leaves out test code by default.
- A path lands on the file that defines the item, following `use` re-exports: `crate::Error`,
  re-exported by `lib.rs` from `error.rs`, is an edge to `error.rs`, not to `lib.rs`; otherwise
  every file that names a root re-export would be in a loop with `lib.rs`.
- A re-export (`pub use`, `pub(crate) use`, ...) is itself an edge only when the file also uses
  the name in its own code: a facade (`lib.rs`, a module of re-exports) depends on nothing, but
  a file that re-exports a name and uses it does.
- A child module is its own node, not part of its parent: `mod child;` alone is no edge, but a
  parent that calls into its child and a child that calls back into its parent (`super::`) are
  a loop, as they are for cargo-modules. (A `mod tests` inside a file is part of that file.)

Usage: scripts/check-module-cycles.py [crate dir ...]; with no argument, the workspace's
crates (`CRATES`), which must name every member of the root `Cargo.toml` that has a `src/`.
Exit status 1 when a cycle is found, each printed as its files, or when a member is missing.
"""

import os
import re
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRATES = [
    "runtime",
    "macros",
    "stores/redis",
    "stores/postgres",
    "integrations/apalis",
    "integrations/http",
    "integrations/consumer",
    "integrations/nats",
    "integrations/lapin",
    "integrations/redis-streams",
    "integrations/sqs",
    "integrations/kafka",
    "cli",
    "conformance",
    "protocol-model",
    "bench",
    "test-support",
    "python",
    "ui-tests",
]

ITEM = re.compile(
    r"\b(?:fn|struct|enum|trait|type|const|static|union|mod)\s+(r#)?([A-Za-z_]\w*)"
    r"|\bmacro_rules!\s*([A-Za-z_]\w*)"
)
USE = re.compile(r"(\bpub(?:\s*\([^)]*\))?\s+)?\buse\s+([^;]*);")
PATH = re.compile(r"(?<![\w:$])(?:::)?((?:[A-Za-z_]\w*\s*::\s*)+(?:[A-Za-z_]\w*|\*|\{))")
MOD_DECL = re.compile(r"\bmod\s+([A-Za-z_]\w*)\s*;")
INLINE_MOD = re.compile(r"\bmod\s+([A-Za-z_]\w*)\s*\{")


def strip(text):
    """The text without comments, strings and char literals, each replaced by spaces so that
    offsets keep their lines."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            m = re.match(r"'(?:\\.[^']*|[^\\'])'", text[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(text, open_brace):
    """The offset just past the `}` that closes the `{` at `open_brace`."""
    depth = 0
    for j in range(open_brace, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def drop_test_modules(text):
    """The text with each `#[cfg(test)] mod … { … }` blanked out."""
    for m in reversed(list(re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", text))):
        end = block_end(text, m.end() - 1)
        text = text[: m.start()] + re.sub(r"[^\n]", " ", text[m.start() : end]) + text[end:]
    return text


def use_paths(tree):
    """`a::{b, c::{d as e, *}}` as [(['a', 'b'], 'b'), (['a', 'c', 'd'], 'e'), (['a', 'c', '*'], None)]."""
    tree = re.sub(r"\s+", " ", tree).strip()
    pos = 0

    def parse(prefix):
        nonlocal pos
        results = []
        segs = list(prefix)
        while pos < len(tree):
            m = re.match(r"\s*(::)?\s*", tree[pos:])
            pos += m.end()
            if pos >= len(tree):
                break
            if tree[pos] == "{":
                pos += 1
                while True:
                    results += parse(segs)
                    m = re.match(r"\s*,?\s*", tree[pos:])
                    pos += m.end()
                    if pos >= len(tree) or tree[pos] == "}":
                        pos += 1
                        return results
            m = re.match(r"(r#)?([A-Za-z_]\w*|\*)", tree[pos:])
            if not m:
                return results
            pos += m.end()
            segs.append(m.group(2))
            m = re.match(r"\s*::", tree[pos:])
            if m:
                pos += m.end()
                continue
            m = re.match(r"\s+as\s+([A-Za-z_]\w*)", tree[pos:])
            alias = None
            if m:
                pos += m.end()
                alias = m.group(1)
            name = None if segs[-1] == "*" else (alias or segs[-1])
            if segs[-1] == "self":
                segs.pop()
                name = alias or (segs[-1] if segs else None)
            results.append((segs, name))
            return results
        return results

    out = []
    while pos < len(tree):
        before = pos
        out += parse([])
        m = re.match(r"\s*,?\s*", tree[pos:])
        pos += m.end()
        if pos == before:
            break
    return out


class File:
    def __init__(self, path, module):
        self.path = path
        self.module = module  # ['a', 'b'] for crate::a::b
        with open(path, encoding="utf-8") as f:
            self.code = drop_test_modules(strip(f.read()))
        self.children = MOD_DECL.findall(self.code)
        self.items = {m.group(2) or m.group(3) for m in ITEM.finditer(self.code)}
        self.inline = [(m.start(), block_end(self.code, m.end() - 1)) for m in INLINE_MOD.finditer(self.code)]
        # name -> (path, is_reexport); globs as (path, None)
        self.uses = []
        for m in USE.finditer(self.code):
            for segs, name in use_paths(m.group(2)):
                self.uses.append((m.start(), segs, name, m.group(1) is not None))
        self.use_spans = [(m.start(), m.end()) for m in USE.finditer(self.code)]

    def depth_at(self, offset):
        """How many inline modules (`mod x { … }`) enclose `offset`."""
        return sum(1 for start, end in self.inline if start < offset < end)


class Crate:
    def __init__(self, src):
        self.src = src
        self.files = {}  # module tuple -> File
        self.why = {}  # (from, to) -> the first path that made the edge
        root = os.path.join(src, "lib.rs")
        if not os.path.exists(root):
            root = os.path.join(src, "main.rs")
        self.load(root, ())
        self.exported_macros = set()
        for f in self.files.values():
            self.exported_macros |= set(re.findall(r"#\[macro_export\]\s*macro_rules!\s*(\w+)", f.code))

    def load(self, path, module):
        f = File(path, list(module))
        self.files[module] = f
        base = os.path.dirname(path) if os.path.basename(path) in ("lib.rs", "main.rs", "mod.rs") else path[:-3]
        for child in f.children:
            for cand in (os.path.join(base, child + ".rs"), os.path.join(base, child, "mod.rs")):
                if os.path.exists(cand):
                    self.load(cand, module + (child,))
                    break

    def absolute(self, f, segs, offset):
        """A path as written in `f` at `offset`, as segments from the crate root, or None for
        another crate's path."""
        here = list(f.module)
        if not segs:
            return None
        if segs[0] == "crate":
            return segs[1:]
        if segs[0] in ("self", "super"):
            inline = f.depth_at(offset)
            rest = list(segs)
            if rest[0] == "self":
                rest = rest[1:]
            while rest and rest[0] == "super":
                if inline:
                    inline -= 1
                elif here:
                    here.pop()
                rest = rest[1:]
            return here + rest
        if segs[0] in f.children:
            return here + segs
        return None

    def resolve(self, segs, seen=None):
        """The module of the file that defines what `segs` (from the crate root) names."""
        seen = seen or set()
        module = ()
        i = 0
        while i < len(segs) and module + (segs[i],) in self.files:
            module += (segs[i],)
            i += 1
        if i == len(segs) or segs[i] in ("*", "{"):
            return module
        name = segs[i]
        f = self.files[module]
        if name in f.items:
            return module
        if (module, name) in seen:
            return module
        seen.add((module, name))
        for offset, useg, uname, _ in f.uses:
            if uname == name:
                target = self.absolute(f, useg, offset)
                return module if target is None else self.resolve(target, seen)
        for offset, useg, uname, _ in f.uses:
            if uname is None:  # a glob: does its module have the name?
                target = self.absolute(f, useg[:-1], offset)
                if target is not None:
                    found = self.resolve(target + [name], seen)
                    if found != tuple(target) or name in self.files[found].items:
                        return found
        if not module and name in self.exported_macros:
            for m, g in self.files.items():
                if re.search(r"macro_rules!\s*" + name + r"\b", g.code):
                    return m
        return module

    def edges(self):
        graph = {m: set() for m in self.files}
        for module, f in self.files.items():
            targets = []
            for offset, segs, name, public in f.uses:
                if public:
                    if name is None:
                        continue
                    outside = f.code
                    for s, e in f.use_spans:
                        outside = outside[:s] + " " * (e - s) + outside[e:]
                    if not re.search(r"\b" + re.escape(name) + r"\b", outside):
                        continue
                target = self.absolute(f, segs, offset)
                if target is not None:
                    targets.append(target)
            in_use = lambda o: any(s <= o < e for s, e in f.use_spans)
            for m in PATH.finditer(f.code):
                if in_use(m.start()):
                    continue
                segs = [s.strip() for s in re.split(r"::", m.group(1))]
                segs = [s for s in segs if s]
                target = self.absolute(f, segs, m.start())
                if target is not None:
                    targets.append(target)
            for target in targets:
                dest = self.resolve(target)
                if dest != module:
                    graph[module].add(dest)
                    self.why.setdefault((module, dest), "::".join(target))
        return graph

    def name(self, module):
        return os.path.relpath(self.files[module].path, self.src)


def cycles(graph):
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def unlisted():
    """The workspace's members with a `src/` that `CRATES` leaves out."""
    with open(os.path.join(ROOT, "Cargo.toml"), "rb") as f:
        members = tomllib.load(f)["workspace"]["members"]
    return [m for m in members if os.path.isdir(os.path.join(ROOT, m, "src")) and m not in CRATES]


def main(args):
    crates = args or CRATES
    failed = False
    if not args:
        for member in unlisted():
            failed = True
            print(f"{member}: a workspace member with a src/ that CRATES leaves out; add it")
    for crate in crates:
        src = os.path.join(ROOT, crate, "src")
        c = Crate(src)
        graph = c.edges()
        found = cycles(graph)
        for comp in found:
            failed = True
            names = [c.name(m) for m in comp]
            print(f"{crate}: a cycle of {len(comp)} modules: {', '.join(names)}")
            members = set(comp)
            for m in comp:
                inside = sorted((c.name(d), c.why[(m, d)]) for d in graph[m] if d in members)
                print(f"    {c.name(m)} -> " + ", ".join(f"{n} (crate::{w})" for n, w in inside))
        if not found:
            print(f"{crate}: {len(graph)} modules, no cycle")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
