"""Sanitize suite: each case run once, forward and backward, in a worker started under NVIDIA's
compute-sanitizer (memcheck by default; racecheck, initcheck and synccheck with
``--attnkit-sanitize``). An access the tool reports fails the test with the kernel, the access and
the case, however right the numbers were (pytest_attnkit/controller/sanitize.py). Not run by
default: a kernel under the tool runs tens of times slower. CUDA only.
"""

import pytest

pytestmark = pytest.mark.attnkit_sanitize


@pytest.mark.attnkit_cases("sanitize")
def test_sanitize(attnkit, attnkit_impl, attnkit_case, attnkit_tool, request):
    attnkit.runner.run(request.node)


@pytest.mark.attnkit_cases("sanitize")
@pytest.mark.attnkit_backward
def test_sanitize_backward(attnkit, attnkit_impl, attnkit_case, attnkit_tool, request):
    attnkit.runner.run(request.node)
