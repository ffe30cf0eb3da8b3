#!/usr/bin/env python3
"""Where the properties suite's five check names appear as whole string literals (ast), per file.
Usage (repo root): python3 tools/structure/check_literals.py DIR...   (default: pytest_attnkit suites)"""
import ast, pathlib, sys, collections
NAMES = ("determinism", "batch_invariance", "cuda_graph", "torch_compile", "opcheck")
dirs = sys.argv[1:] or ["pytest_attnkit", "suites"]
per_file = collections.Counter(); per_name = collections.Counter()
for d in dirs:
    for path in sorted(pathlib.Path(d).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES:
                per_file[str(path)] += 1; per_name[node.value] += 1
for f, n in per_file.most_common():
    print(f"{n:4} {f}")
print(f"{sum(per_file.values()):4} literals in {len(per_file)} files; per name: {dict(per_name)}")
