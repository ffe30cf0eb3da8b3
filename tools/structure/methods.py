#!/usr/bin/env python3
"""Methods of a class with their first line and length. Usage (repo root): python3 methods.py FILE CLASS"""
import ast, sys
path, name = sys.argv[1], sys.argv[2]
cls = next(n for n in ast.walk(ast.parse(open(path).read())) if isinstance(n, ast.ClassDef) and n.name == name)
for fn in cls.body:
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        print(f"  {fn.lineno:4}  {fn.end_lineno - fn.lineno + 1:4}  {fn.name}")
