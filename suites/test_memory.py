"""Memory-scaling suite: peak extra device memory as the sequence grows, fitted on log-log axes.

A standard attention stores the N x N scores (O(N^2)); a flash kernel keeps only tiles and
per-row statistics (O(N)). Each test sweeps N (pytest_attnkit/cases.py: memory_sweep), measures
at the allocator (pytest_attnkit/worker/memory.py; the fit and the verdict:
pytest_attnkit/controller/memory.py), and fails when the fitted exponent contradicts the
implementation's declared memory class, when memory escapes the meter, or when the measurement
misses the implementation's own analytic model by more than 10%. CUDA only.
"""

import pytest

pytestmark = pytest.mark.attnkit_memory


def test_memory_forward(attnkit, attnkit_impl, request):
    attnkit.memory.check(attnkit_impl, backward=False, properties=request.node.user_properties)


@pytest.mark.attnkit_backward
def test_memory_backward(attnkit, attnkit_impl, request):
    attnkit.memory.check(attnkit_impl, backward=True, properties=request.node.user_properties)
