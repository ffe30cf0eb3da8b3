"""Properties suite: behaviour the float64 oracle cannot see on the day.

Determinism (forward, and backward), batch invariance, capture and replay in a CUDA graph,
``torch.compile(fullgraph=True)``, and ``torch.library.opcheck`` for a kernel registered as a custom
op: each run on the profile's property cases (pytest_attnkit/cases.py: property_cases) in the
implementation's worker (pytest_attnkit/worker/properties.py). What an implementation declares
(``deterministic``, ``batch_invariant``, ``supports_cuda_graphs``, ``supports_torch_compile``,
``custom_op``) must hold; what it does not declare is checked and reported, not failed
(pytest_attnkit/controller/properties.py).

The test functions are made from the one list of checks (pytest_attnkit/properties.py:
PROPERTIES), a function per property and direction, in its order: test_determinism,
test_determinism_backward, test_batch_invariance, test_cuda_graph, test_torch_compile, test_opcheck.
Each body is every suite test's: ``attnkit.runner.run(request.node)``.
"""

from pathlib import Path

from pytest_attnkit import plugin
from pytest_attnkit.controller.properties import PropertyCheck

_made = plugin.tests_module(PropertyCheck, Path(__file__))
pytestmark = _made.pytestmark
globals().update({spec.function: getattr(_made, spec.function) for spec in PropertyCheck.tests})
