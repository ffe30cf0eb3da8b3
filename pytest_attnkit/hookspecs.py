"""Extension hooks: implement them in a ``conftest.py`` (at the rootdir) or a plugin."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_attnkit.contract import AccuracyBudget, Case


def pytest_attnkit_modify_cases(config: pytest.Config, family: str, cases: "list[Case]") -> None:
    """Add, remove or replace cases of a family before they are parametrized, in place.

    ``family`` is ``"correctness"``, ``"speed-forward"`` or ``"speed-backward"``. Example, to test
    the shape your model runs::

        # conftest.py
        from pytest_attnkit import Case

        def pytest_attnkit_modify_cases(config, family, cases):
            if family == "correctness":
                cases.append(Case(batch=2, heads_q=32, heads_kv=8, seqlen_q=3000, seqlen_k=3000,
                                  head_dim=128, dtype="bfloat16", causal=True))
    """


@pytest.hookspec(firstresult=True)
def pytest_attnkit_reference(config: pytest.Config) -> str | None:
    """Name the implementation whose in-run speed tells a slower machine from a slower kernel
    (default: ``--attnkit-reference``, itself ``torch_sdpa`` by default). Example::

        # conftest.py
        def pytest_attnkit_reference(config):
            return "my_trusted_kernel"
    """


@pytest.hookspec(firstresult=True)
def pytest_attnkit_threshold(config: pytest.Config, impl: str, mode: str, case_id: str, default: float) -> float | None:
    """The gate's practical threshold for one implementation, mode and case, as a share (0.05 is
    5%); return None to keep ``default`` (from ``--attnkit-threshold`` and ``attnkit_thresholds``).
    Example, for a kernel whose short decode cases are noisy::

        # conftest.py
        def pytest_attnkit_threshold(config, impl, mode, case_id, default):
            if impl == "my_kernel" and "-q1-" in case_id:
                return 0.10
    """


@pytest.hookspec(firstresult=True)
def pytest_attnkit_accuracy(config: pytest.Config, impl: str, case: "Case") -> "str | AccuracyBudget | None":
    """The accuracy that judges one implementation on one correctness case: "exact", "quantized"
    or an :class:`~pytest_attnkit.AccuracyBudget`; return None to keep the implementation's own
    ``accuracy``. FP8 cases are judged by FA3's FP8 rule whatever is returned. Example, for an
    INT8 kernel that is exact on fp32 cases but quantizes Q and K otherwise, with a looser budget
    where the logits are large::

        # conftest.py
        from pytest_attnkit import AccuracyBudget

        def pytest_attnkit_accuracy(config, impl, case):
            if impl == "my_int8_attn":
                if case.dtype == "float32":
                    return "exact"
                if case.logit_scale > 1:
                    return AccuracyBudget(max_rel_l1=0.05, min_cosine=0.995, max_row_rel_l1=0.2,
                                          name="int8-large-logits")
    """
