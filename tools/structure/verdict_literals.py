#!/usr/bin/env python3
"""Whole string literals (ast Constant) that are verdict words, per group and per file.
Usage (repo root): python3 tools/structure/verdict_literals.py [DIR...]"""
import ast, pathlib, sys, collections
GROUPS = {
    "gate/paired": ("regression", "improvement", "unchanged", "insufficient", "not compared", "other program"),
    "memory class": ("linear", "quadratic", "neither", "unclear"),
    "memory point": ("measured", "oom", "error", "not run"),
    "test outcome": ("passed", "failed", "skipped"),
    "impl status": ("available", "unavailable", "broken"),
}
dirs = sys.argv[1:] or ["pytest_attnkit"]
found = collections.defaultdict(collections.Counter)
for d in dirs:
    for path in sorted(pathlib.Path(d).rglob("*.py")):
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                for group, words in GROUPS.items():
                    if node.value in words:
                        found[group][str(path)] += 1
total = 0
for group, files in found.items():
    n = sum(files.values()); total += n
    print(f"{group}: {n} in {len(files)} files: " + ", ".join(f"{f.split('/',1)[1]} {c}" for f, c in files.most_common()))
print(f"all groups: {total}")
