#!/usr/bin/env python3
"""Import cycles between the top-level modules of each crate.

A module *uses* another when a file of it names `crate::other` (or `use
crate::{.., other, ..}`) outside its `#[cfg(test)]` items and comments. A cycle is a
strongly connected set of two or more modules. Prints each cycle and exits 1
when there is any; 0 and "0 cycles" otherwise. `--graph` prints what each
top-level module uses.
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


def uses(text, modules):
    text = code(text)
    found = set()
    for m in re.finditer(r"crate::([a-z_][a-z0-9_]*)", text):
        found.add(m.group(1))
    # use crate::{a, b::c, ...}
    for m in re.finditer(r"crate::\{([^}]*)\}", text, re.S):
        for part in m.group(1).split(","):
            name = part.strip().split("::")[0].strip()
            if name:
                found.add(name)
    return found & modules


def crate_graph(src):
    modules = {}
    for entry in os.listdir(src):
        path = os.path.join(src, entry)
        if entry.endswith(".rs") and entry not in ("lib.rs", "main.rs"):
            modules[entry[:-3]] = [path]
        elif os.path.isdir(path) and entry != "bin":
            files = []
            for d, _, fs in os.walk(path):
                files += [os.path.join(d, f) for f in fs if f.endswith(".rs")]
            modules[entry] = files
    names = set(modules)
    graph = {}
    for m, files in modules.items():
        deps = set()
        for f in files:
            with open(f, encoding="utf-8") as fh:
                deps |= uses(strip_tests(fh.read()), names)
        deps.discard(m)
        graph[m] = deps
    return graph


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
        for comp in sccs(crate_graph(src)):
            bad += 1
            print(f"{crate}: import cycle among {', '.join(comp)}")
    print(f"{bad} cycles" if bad else "0 cycles")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
