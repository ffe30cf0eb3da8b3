"""Correctness suite: every implementation against the float64 oracle, forward and backward.

The rule (pytest_attnkit/worker/tolerance.py): the worst error may be at most 2x (3x for
gradients) the error of a plain same-precision implementation, plus a rounding floor. Each check
runs in the implementation's worker; see pytest_attnkit/worker/correctness.py for the order of
operations that keeps unwritten outputs and modified inputs from passing, and
pytest_attnkit/controller/correctness.py for the pytest side (each test's body: the runner,
pytest_attnkit/controller/runner.py).
"""

import pytest

pytestmark = pytest.mark.attnkit_correctness


@pytest.mark.attnkit_cases("correctness")
def test_forward(attnkit, attnkit_impl, attnkit_case, request):
    attnkit.runner.run(request.node)


@pytest.mark.attnkit_cases("correctness")
@pytest.mark.attnkit_backward
def test_backward(attnkit, attnkit_impl, attnkit_case, request):
    attnkit.runner.run(request.node)
