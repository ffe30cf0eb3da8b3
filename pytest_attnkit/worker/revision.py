"""Loading an implementation from another version of its package (``--attnkit-against``).

The worker for ``<impl>@<rev>`` runs this version's harness (the timer, the inputs, the contract
that implementations derive from) and REV's kernels: an A/B comparison must time both versions
with the same timer, and REV's harness may not even speak this version's protocol. REV was
installed into a folder of its own (its ``site``), which the pytest process put first on this
worker's sys.path, so REV's own top-level packages win over the current ones.

One case needs more: an implementation that lives inside the harness's own package
(``pytest_attnkit.implementations`` of this project). ``pytest_attnkit`` is already imported here,
from the current checkout, so its subpackages would be found there too. Each package on the
entry point's module path that is not yet imported and that REV's site holds is therefore
imported from the site explicitly; what the harness has already imported stays the harness's.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def take_from_revision(site: str, entry_point_value: str) -> None:
    """Make the modules of ``entry_point_value`` ("package.module:attr") resolve into ``site``."""
    module = entry_point_value.split(":", 1)[0].strip()
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if name in sys.modules:
            continue  # the harness's own (or REV's, already taken from the site)
        folder = Path(site, *parts[:depth])
        init = folder / "__init__.py"
        if init.is_file():
            spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)])
        elif folder.with_suffix(".py").is_file():
            spec = importlib.util.spec_from_file_location(name, folder.with_suffix(".py"))
        else:
            return  # not in REV's site: found the usual way, on sys.path with the site first
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded
        try:
            spec.loader.exec_module(loaded)
        except BaseException:
            del sys.modules[name]
            raise
        if depth > 1:
            setattr(sys.modules[".".join(parts[:depth - 1])], parts[depth - 1], loaded)
