"""Memory-scaling suite: peak extra device memory as the sequence grows, fitted on log-log axes.

A standard attention stores the N x N scores (O(N^2)); a flash kernel keeps only tiles and
per-row statistics (O(N)). Each test sweeps N (pytest_attnkit/cases.py: memory_sweep), measures
at the allocator (pytest_attnkit/worker/memory.py; the fit and the verdict:
pytest_attnkit/controller/memory.py), and fails when the fitted exponent contradicts the
implementation's declared memory class, when memory escapes the meter, or when the measurement
misses the implementation's own analytic model by more than 10%. CUDA only.

Each test's sweep is named by the suite (pytest_attnkit/controller/memory.py: MemoryCheck.tests); an
implementation that does not declare what a sweep needs (windows, varlen, paged KV) is skipped at
collection with its reasons.
``test_memory_window`` sweeps again with a sliding window (pytest_attnkit/cases.py:
memory_window_sweep) for the implementations that declare windows: each query sees a bounded
number of keys, so a kernel that still allocates N x N scores under a window fails its class.
``test_memory_varlen`` and ``test_memory_paged`` sweep the total tokens of packed sequences and of a
paged cache (pytest_attnkit/cases.py: memory_layout_sweep), for the implementations that declare
them: the extra memory must grow with the tokens, not with the longest sequence squared nor with
the batch times the longest.
"""

import pytest

pytestmark = pytest.mark.attnkit_memory


def test_memory_forward(attnkit, attnkit_impl, request):
    attnkit.runner.run(request.node)


@pytest.mark.attnkit_backward
def test_memory_backward(attnkit, attnkit_impl, request):
    attnkit.runner.run(request.node)


def test_memory_window(attnkit, attnkit_impl, request):
    attnkit.runner.run(request.node)


@pytest.mark.attnkit_backward
def test_memory_window_backward(attnkit, attnkit_impl, request):
    attnkit.runner.run(request.node)


def test_memory_varlen(attnkit, attnkit_impl, request):
    attnkit.runner.run(request.node)


@pytest.mark.attnkit_backward
def test_memory_varlen_backward(attnkit, attnkit_impl, request):
    attnkit.runner.run(request.node)


def test_memory_paged(attnkit, attnkit_impl, request):
    attnkit.runner.run(request.node)
