#!/usr/bin/env python3
"""Fields of a class that change after __init__: assigned (self.x = / +=) in another method, or
mutated in place (self.x[..] = ..., self.x.append/remove/pop/clear/add/setdefault/appendleft/update/discard).
Usage (repo root): python3 tools/structure/mutable_fields.py FILE CLASS"""
import ast, sys
MUTATORS = {"append", "appendleft", "remove", "pop", "popleft", "clear", "add", "discard", "setdefault", "update", "extend", "insert"}
path, name = sys.argv[1], sys.argv[2]
cls = next(n for n in ast.walk(ast.parse(open(path).read())) if isinstance(n, ast.ClassDef) and n.name == name)
init_fields, changed = [], {}
def attr(node):
    return node.attr if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" else None
for fn in cls.body:
    if not isinstance(fn, ast.FunctionDef):
        continue
    for node in ast.walk(fn):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for sub in ast.walk(t):
                a = attr(sub)
                if a and sub is t or (a and isinstance(t, ast.Tuple)):
                    if fn.name == "__init__":
                        init_fields.append(a)
                    else:
                        changed.setdefault(a, set()).add(f"{fn.name} (assign)")
            if isinstance(t, ast.Subscript) and attr(t.value):
                changed.setdefault(attr(t.value), set()).add(f"{fn.name} ([]=)")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            inner = node.func.value
            while isinstance(inner, ast.Subscript):
                inner = inner.value
            a = attr(inner)
            if a and fn.name != "__init__":
                changed.setdefault(a, set()).add(f"{fn.name} (.{node.func.attr})")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "next" and node.args and attr(node.args[0]):
            changed.setdefault(attr(node.args[0]), set()).add(f"{fn.name} (next)")
print(f"{name}: {len(set(init_fields))} fields set in __init__: {', '.join(dict.fromkeys(init_fields))}")
mutable = [f for f in dict.fromkeys(init_fields) if f in changed]
print(f"{len(mutable)} of them change after __init__:")
for f in mutable:
    print(f"  {f}: {', '.join(sorted(changed[f]))}")
