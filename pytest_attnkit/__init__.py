"""pytest-attnkit: correctness, memory and speed suites for attention kernels, as a pytest plugin.

Import what a third-party implementation needs from here; nothing heavy is imported.
"""

from pytest_attnkit.contract import AccuracyBudget, AttentionImpl, Case, FunctionImpl

__all__ = ["AccuracyBudget", "AttentionImpl", "Case", "FunctionImpl", "Judgement", "Planned", "Suite", "SuiteContext",
           "SuiteItem", "TestSpec", "Verdict", "__version__"]
__version__ = "0.1.0"

#: What a suite's pytest side needs (docs/suites.md), imported on first use: a worker process
#: imports this package, never the pytest side.
_SUITE_NAMES = {"Suite": "suite", "SuiteContext": "suite", "SuiteItem": "suite", "TestSpec": "suite",
                "Planned": "suite", "Judgement": "outcome", "Verdict": "outcome"}


def __getattr__(name: str) -> object:
    module = _SUITE_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_attnkit' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"pytest_attnkit.controller.{module}"), name)
