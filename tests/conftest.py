"""Fixtures for the plugin's own tests: a fake third-party distribution of attention kernels.

``fake_dist`` writes a real ``*.dist-info`` folder (METADATA and entry_points.txt) and a module
of implementations into pytester's directory and puts it on sys.path, so discovery goes through
importlib.metadata exactly as for a package installed with pip. The workers inherit sys.path.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

FAKE_KERNELS = Path(__file__).with_name("fakes") / "fake_kernels.py"

# Tests marked ``timing`` run with no other test beside them under ``pytest -n`` (tests/alone.py).
pytest_plugins = ["alone"]

# pytester's in-process runs forget every module first imported inside them. matplotlib (the
# report's plots) cannot be imported a second time into a process that kept pieces of the first
# import ("'Figure' object has no attribute 'items'" in the next inner run that draws), so it is
# imported here, once, where every inner run finds it.
try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
except ImportError:  # the report extra is not installed: no plots are drawn
    pass


@pytest.fixture
def fake_dist(pytester: pytest.Pytester):
    """Register ``{name: "module:attr"}`` entry points from a fake distribution ``fake-kernels``
    (``groups``: entry points of other groups, ``{"attnkit.suites": {...}}``)."""

    def register(entry_points: dict[str, str], *, extra_modules: dict[str, str] | None = None,
                 groups: dict[str, dict[str, str]] | None = None) -> Path:
        root = pytester.path / "site"
        root.mkdir(exist_ok=True)
        (root / "fake_kernels.py").write_text(FAKE_KERNELS.read_text())
        for name, source in (extra_modules or {}).items():
            (root / f"{name}.py").write_text(textwrap.dedent(source))
        info = root / "fake_kernels-0.1.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-kernels\nVersion: 0.1\n")
        sections = {"attnkit.implementations": entry_points, **(groups or {})}
        (info / "entry_points.txt").write_text("".join(
            f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in found.items())
            for group, found in sections.items()))
        pytester.syspathinsert(root)
        return root

    return register


@pytest.fixture(autouse=True)
def shared_compile_cache(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The inner runs share one compile cache for the whole session, as a user's runs share theirs
    (pytester gives each test a HOME of its own, where the default folder would start empty)."""
    if "ATTNKIT_CACHE_DIR" not in os.environ:
        base = tmp_path_factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):
            base = base.parent  # under pytest -n, each xdist worker's folder is inside the session's
        monkeypatch.setenv("ATTNKIT_CACHE_DIR", str(base / "compile-cache"))
