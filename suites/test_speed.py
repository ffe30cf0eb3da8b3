"""Speed suite: time every implementation, report TFLOP/s and GB/s against this machine's
measured ceilings and the reference implementation, and gate against this GPU's baseline.

Timing: CUDA events around each call with L2 flushed, warm-up, enough samples for a stable median
(pytest_attnkit/worker/timer.py). FLOPs and bytes: pytest_attnkit/counts.py. The check:
pytest_attnkit/controller/speed.py. The gate: a one-sided Mann-Whitney U test plus a practical
threshold, after dividing out how much slower the machine runs the reference
(pytest_attnkit/controller/gate.py). Baselines: one JSON file per GPU
(pytest_attnkit/controller/baselines.py).
"""

import pytest

pytestmark = pytest.mark.attnkit_speed


def _benchmark(request):
    """pytest-benchmark's fixture, which the suite hands the samples to; None where it is not installed."""
    try:
        return request.getfixturevalue("benchmark")
    except pytest.FixtureLookupError:
        return None


@pytest.mark.attnkit_cases("speed-forward")
def test_speed_forward(attnkit, attnkit_impl, attnkit_case, request):
    attnkit.runner.run(request.node, benchmark=_benchmark(request))


@pytest.mark.attnkit_cases("speed-backward")
@pytest.mark.attnkit_backward
def test_speed_backward(attnkit, attnkit_impl, attnkit_case, request):
    attnkit.runner.run(request.node, benchmark=_benchmark(request))
