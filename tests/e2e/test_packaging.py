"""What an installed (not editable) copy ships: setuptools packs only the packages pyproject.toml
lists, so a package folder left off the list is missing from every wheel, while an editable
install (which CI and the README use) still finds it. pytest_attnkit.controller and
pytest_attnkit.worker were off the list until 2026-11-26."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_for_the_wheel() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    folders = setuptools["package-dir"]
    found = set()
    for package, folder in folders.items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            relative = init.parent.relative_to(root).parts
            if any(part.startswith(".") or part == "__pycache__" for part in relative):
                continue
            found.add(".".join((package, *relative)))
    missing = sorted(found - listed)
    assert not missing, f"package folders a wheel would leave out (add them to [tool.setuptools] packages): {missing}"
    assert sorted(listed - found) == [], "listed packages with no folder"
