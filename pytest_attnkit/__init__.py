"""pytest-attnkit: correctness, memory and speed suites for attention kernels, as a pytest plugin.

Import what a third-party implementation needs from here; nothing heavy is imported.
"""

from pytest_attnkit.contract import AccuracyBudget, AttentionImpl, Case, FunctionImpl

__all__ = ["AccuracyBudget", "AttentionImpl", "Case", "FunctionImpl", "__version__"]
__version__ = "0.1.0"
