"""Memory-scaling suite: peak extra device memory as the sequence grows, fitted on log-log axes.

A standard attention stores the N x N scores (O(N^2)); a flash kernel keeps only tiles and
per-row statistics (O(N)). Each test sweeps N (pytest_attnkit/cases.py: memory_sweep), measures
at the allocator (pytest_attnkit/worker/memory.py; the fit and the verdict:
pytest_attnkit/controller/memory.py), and fails when the fitted exponent contradicts the
implementation's declared memory class, when memory escapes the meter, or when the measurement
misses the implementation's own analytic model by more than 10%. CUDA only.

``test_memory_window`` sweeps again with a sliding window (pytest_attnkit/cases.py:
memory_window_sweep) for the implementations that declare windows: each query sees a bounded
number of keys, so a kernel that still allocates N x N scores under a window fails its class.
``test_memory_varlen`` and ``test_memory_paged`` sweep the total tokens of packed sequences and of a
paged cache (pytest_attnkit/cases.py: memory_layout_sweep), for the implementations that declare
them: the extra memory must grow with the tokens, not with the longest sequence squared nor with
the batch times the longest.
"""

import pytest

from pytest_attnkit.cases import memory_layout_sweep, memory_window_sweep

pytestmark = pytest.mark.attnkit_memory


def test_memory_forward(attnkit, attnkit_impl, request):
    attnkit.memory.check(attnkit_impl, backward=False, properties=request.node.user_properties)


@pytest.mark.attnkit_backward
def test_memory_backward(attnkit, attnkit_impl, request):
    attnkit.memory.check(attnkit_impl, backward=True, properties=request.node.user_properties)


def _check_declared(attnkit, impl, backward, request, sweep):
    refusals = attnkit.pool.support(impl, [{"case": sweep.case(sweep.seqlens[0]).to_dict(), "backward": backward}])
    if refusals and refusals[0]:
        pytest.skip(f"{impl} does not support it: {refusals[0]}")
    attnkit.memory.check(impl, backward=backward, properties=request.node.user_properties, sweep=sweep)


def test_memory_window(attnkit, attnkit_impl, request):
    _check_declared(attnkit, attnkit_impl, False, request, memory_window_sweep(attnkit.profile))


@pytest.mark.attnkit_backward
def test_memory_window_backward(attnkit, attnkit_impl, request):
    _check_declared(attnkit, attnkit_impl, True, request, memory_window_sweep(attnkit.profile))


def test_memory_varlen(attnkit, attnkit_impl, request):
    _check_declared(attnkit, attnkit_impl, False, request, memory_layout_sweep(attnkit.profile, "varlen"))


@pytest.mark.attnkit_backward
def test_memory_varlen_backward(attnkit, attnkit_impl, request):
    _check_declared(attnkit, attnkit_impl, True, request, memory_layout_sweep(attnkit.profile, "varlen"))


def test_memory_paged(attnkit, attnkit_impl, request):
    _check_declared(attnkit, attnkit_impl, False, request, memory_layout_sweep(attnkit.profile, "paged"))
