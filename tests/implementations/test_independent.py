"""The bundled kernels are judged by the oracle: none may compute with it. A kernel that called
the oracle's math would pass the correctness suite by construction."""

from __future__ import annotations

import ast
from pathlib import Path

IMPLEMENTATIONS = Path(__file__).resolve().parents[2] / "implementations"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_bundled_kernel_imports_the_oracle() -> None:
    sources = sorted(IMPLEMENTATIONS.rglob("*.py"))
    assert len(sources) >= 6  # torch_sdpa, torch_flex, cupy_naive and triton_flash's modules
    offenders = {str(path.relative_to(IMPLEMENTATIONS)): sorted(name for name in _imports(path) if "oracle" in name)
                 for path in sources}
    assert {path: names for path, names in offenders.items() if names} == {}
