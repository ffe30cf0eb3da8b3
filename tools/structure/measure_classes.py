#!/usr/bin/env python3
"""Lines and method counts per class in pytest_attnkit/ (run from the repo root).
Usage: python3 tools/structure/measure_classes.py [min_lines]"""
import ast, pathlib, sys
min_lines = int(sys.argv[1]) if len(sys.argv) > 1 else 0
rows = []
for path in sorted(pathlib.Path("pytest_attnkit").rglob("*.py")):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            lines = node.end_lineno - node.lineno + 1
            if lines >= min_lines:
                rows.append((str(path), node.name, node.lineno, node.end_lineno, lines, len(methods)))
rows.sort(key=lambda r: -r[4])
print(f"{'file':45} {'class':28} {'lines':>11} {'n':>5} {'methods':>7}")
for f, c, a, b, n, m in rows:
    print(f"{f:45} {c:28} {a:>5}-{b:<5} {n:>5} {m:>7}")
