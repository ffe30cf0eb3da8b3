"""Speed suite: time every implementation, report TFLOP/s and GB/s against this machine's
measured ceilings and the reference implementation, and gate against this GPU's baseline.

Timing: CUDA events around each call with L2 flushed, warm-up, enough samples for a stable median
(pytest_attnkit/timer.py). FLOPs and bytes: pytest_attnkit/speed.py. The gate: a one-sided
Mann-Whitney U test plus a practical threshold, after dividing out how much slower the machine runs
the reference (pytest_attnkit/gate.py). Baselines: one JSON file per GPU (pytest_attnkit/baselines.py).
"""

import pytest

pytestmark = pytest.mark.attnkit_speed


@pytest.mark.attnkit_cases("speed-forward")
def test_speed_forward(attnkit, attnkit_impl, attnkit_case, request):
    attnkit.check_speed(attnkit_impl, attnkit_case, backward=False, request=request)


@pytest.mark.attnkit_cases("speed-backward")
@pytest.mark.attnkit_backward
def test_speed_backward(attnkit, attnkit_impl, attnkit_case, request):
    attnkit.check_speed(attnkit_impl, attnkit_case, backward=True, request=request)
