"""Properties suite: behaviour the float64 oracle cannot see on the day.

Determinism (forward, and backward), batch invariance, capture and replay in a CUDA graph,
``torch.compile(fullgraph=True)``, and ``torch.library.opcheck`` for a kernel registered as a custom
op: each run on the profile's property cases (pytest_attnkit/cases.py: property_cases) in the
implementation's worker (pytest_attnkit/worker/properties.py). What an implementation declares
(``deterministic``, ``batch_invariant``, ``supports_cuda_graphs``, ``supports_torch_compile``,
``custom_op``) must hold; what it does not declare is checked and reported, not failed
(pytest_attnkit/controller/properties.py).
"""

import pytest

pytestmark = pytest.mark.attnkit_properties


@pytest.mark.attnkit_cases("properties")
def test_determinism(attnkit, attnkit_impl, attnkit_case, request):
    attnkit.runner.run(request.node)


@pytest.mark.attnkit_cases("properties")
@pytest.mark.attnkit_backward
def test_determinism_backward(attnkit, attnkit_impl, attnkit_case, request):
    attnkit.runner.run(request.node)


@pytest.mark.attnkit_cases("properties")
def test_batch_invariance(attnkit, attnkit_impl, attnkit_case, request):
    attnkit.runner.run(request.node)


@pytest.mark.attnkit_cases("properties")
def test_cuda_graph(attnkit, attnkit_impl, attnkit_case, request):
    attnkit.runner.run(request.node)


@pytest.mark.attnkit_cases("properties")
def test_torch_compile(attnkit, attnkit_impl, attnkit_case, request):
    attnkit.runner.run(request.node)


@pytest.mark.attnkit_cases("properties")
def test_opcheck(attnkit, attnkit_impl, attnkit_case, request):
    attnkit.runner.run(request.node)
