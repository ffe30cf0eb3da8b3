"""An example third-party suite for pytest-attnkit (docs/suites.md): ``bounds``.

Softmax weights are non-negative and sum to one, so each output element of attention lies between
the smallest and the largest value of V over the keys (per batch, head and feature), within the
dtype's rounding. A kernel that forgets to normalise, or writes garbage to a tail tile, fails it.

Two modules: :mod:`attnkit_example_suite.controller` (the pytest side, a ``pytest_attnkit.Suite``)
and :mod:`attnkit_example_suite.worker` (the worker side, a ``SuiteHandler``, and the record both
read). Neither imports torch at import time.
"""
