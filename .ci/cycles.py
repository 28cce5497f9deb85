#!/usr/bin/env python3
"""Import cycles between the modules of each crate, at every level.

Modules are compared with their siblings: the top-level modules of a
crate, and the files (or folders) of one folder module. A module *uses* a
sibling when a file in it names a path into the sibling, written from
`crate::`, `super::` (any number) or `self::`, in a plain path or a `use`
tree (`use super::{a, b::c}`), outside `#[cfg(test)]` items and comments.
A parent and its own children are not compared (a folder's `mod.rs`
declares them). A cycle is a strongly connected set of two or more
siblings. Prints each cycle and exits 1 when there is any; 0 and "0
cycles" otherwise. `--graph` prints what each top-level module uses.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates")


def strip_tests(text):
    """The text without `#[cfg(test)]` items (a module or function body),
    found by brace matching from the attribute."""
    out, i = [], 0
    while True:
        j = text.find("#[cfg(test)]", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        k = text.find("{", j)
        semi = text.find(";", j)
        if k < 0 or (0 <= semi < k):
            i = semi + 1 if semi >= 0 else len(text)
            continue
        depth, p = 0, k
        while p < len(text):
            if text[p] == "{":
                depth += 1
            elif text[p] == "}":
                depth -= 1
                if depth == 0:
                    break
            p += 1
        i = p + 1


def code(text):
    """The text without comment lines (doc links are not uses)."""
    return "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("//"))


IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
START = re.compile(r"\b(crate|super|self)\b((?:\s*::\s*super\b)*)\s*::\s*")


def tree(text, i):
    """The paths of a use tree (or of a plain path) starting at `i`, as
    lists of segments, and where it ends. `a::b::{c, d::e}` gives
    [a, b, c] and [a, b, d, e]."""
    m = IDENT.match(text, i)
    if m:
        seg, i = m.group(0), m.end()
        j = i
        while j < len(text) and text[j] in " \t\n":
            j += 1
        if text.startswith("::", j):
            j += 2
            while j < len(text) and text[j] in " \t\n":
                j += 1
            rest, i = tree(text, j)
            return [[seg] + r for r in rest], i
        return [[seg]], i
    if i < len(text) and text[i] == "{":
        out, i = [], i + 1
        while i < len(text):
            while i < len(text) and text[i] in " \t\n,":
                i += 1
            if i < len(text) and text[i] == "}":
                return out, i + 1
            sub, j = tree(text, i)
            if j == i:
                # Not a path (`*`, `self as x`): skip a character.
                j = i + 1
            out += sub
            i = j
        return out, i
    return [[]], i


def paths(text, here):
    """Every module path the text names (`crate::`, `super::`, `self::`),
    absolute, from a file whose module is `here` (a tuple)."""
    text = code(text)
    out = []
    for m in START.finditer(text):
        root, supers = m.group(1), m.group(2).count("super")
        if root == "crate":
            base = ()
        elif root == "self":
            base = here
        else:
            up = 1 + supers
            if up > len(here):
                continue
            base = here[: len(here) - up]
        for p in tree(text, m.end())[0]:
            out.append(base + tuple(x for x in p if x != "self"))
    return out


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def crate_modules(src):
    """Every file of the crate (but `bin/`) by its module path."""
    files = {}
    for d, dirs, fs in os.walk(src):
        if d == src and "bin" in dirs:
            dirs.remove("bin")
        for f in fs:
            if f.endswith(".rs"):
                path = os.path.join(d, f)
                files[module_of(src, path)] = path
    return files


def crate_graphs(src):
    """For each module with submodules, what each submodule uses among
    its siblings: `{parent: {child: {sibling, ..}}}`. A file under
    `a::b` that names `a::c::x` makes `b` use `c` under `a`; names of
    items rather than modules stop where the module tree stops."""
    files = crate_modules(src)
    known = set(files)
    for m in list(known):
        for k in range(len(m)):
            known.add(m[:k])
    graphs = {}
    for m in known:
        if m:
            graphs.setdefault(m[:-1], {}).setdefault(m[-1], set())
    for here, path in files.items():
        with open(path, encoding="utf-8") as fh:
            text = strip_tests(fh.read())
        for target in paths(text, here):
            # The longest module prefix: what the path is in.
            while target and target not in known:
                target = target[:-1]
            # Where the two first part: siblings under their common parent.
            k = 0
            while k < len(here) and k < len(target) and here[k] == target[k]:
                k += 1
            if k < len(here) and k < len(target):
                graphs[here[:k]][here[k]].add(target[k])
    return graphs


def crate_graph(src):
    """What each top-level module uses."""
    return crate_graphs(src).get((), {})


def sccs(graph):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
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


def main():
    if "--graph" in sys.argv:
        for crate in sorted(os.listdir(ROOT)):
            src = os.path.join(ROOT, crate, "src")
            if os.path.isdir(src):
                for m, deps in sorted(crate_graph(src).items()):
                    print(f"{crate}: {m} -> {' '.join(sorted(deps)) or '(nothing)'}")
        return 0
    bad = 0
    for crate in sorted(os.listdir(ROOT)):
        src = os.path.join(ROOT, crate, "src")
        if not os.path.isdir(src):
            continue
        for parent, graph in sorted(crate_graphs(src).items()):
            where = "::".join(parent) + "::" if parent else ""
            for comp in sccs(graph):
                bad += 1
                names = ", ".join(where + c for c in comp)
                print(f"{crate}: import cycle among {names}")
    print(f"{bad} cycles" if bad else "0 cycles")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
