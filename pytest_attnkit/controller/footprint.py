"""How much device memory a request may take, so the scheduler runs together only what fits.

An estimate from the case alone, on the generous side, in bytes:

- the tensors that go in and come out (q, k, v, the output; with backward the upstream gradient
  and the three gradients), in the case's dtype, with the copies the check keeps (the inputs'
  snapshots) and their float64 upcasts for the oracle;
- the references of a correctness check, which materialize the N x N scores of every sequence:
  the float64 oracle (scores, probabilities and, with backward, their gradients) and the plain
  same-precision reference;
- the implementation's own workspace: nothing beyond its inputs for one that declares linear
  memory, the N x N scores in float32 (twice, with backward) for any other, since an undeclared
  kernel may well materialize them.

The scheduler's budget is most of the GPU's memory, less each worker's CUDA context
(:func:`budget_bytes`). The estimate only decides what runs beside what: a request that runs out
of memory beside another is run again alone before its verdict counts.
"""

from __future__ import annotations

from pytest_attnkit.contract import Case

_ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
#: Per worker process: its CUDA context, cuBLAS's workspace and the allocator's slack.
WORKER_RESERVE_BYTES = 1 << 30
#: The share of the device the scheduler may fill with requests' estimates.
DEVICE_SHARE = 0.85


def score_elements(case: Case) -> int:
    """Elements of the N x N scores over every sequence and query head."""
    return case.heads_q * sum(queries * keys for queries, keys in case.sequences)


def tensor_elements(case: Case, *, backward: bool) -> int:
    """Elements of q, k, v and the output (with backward, also dout, dq, dk and dv)."""
    rows_q = case.total_q + case.unused_tokens
    rows_k = case.total_k + case.unused_tokens
    if case.kind == "paged":
        rows_k = int(rows_k * 1.25) + case.batch * (case.page_size or 1) * 2  # spare pages, as the inputs draw them
    q = rows_q * case.heads_q * case.head_dim
    k = rows_k * case.heads_kv * case.head_dim
    v = rows_k * case.heads_kv * case.value_dim
    out = rows_q * case.heads_q * case.value_dim
    return (q + k + v + out) * (2 if backward else 1)


def request_bytes(case: Case, *, backward: bool, references: bool, linear_memory: bool, input_sets: int = 1) -> int:
    """The estimate described in the module docstring. ``references``: a correctness check (the
    oracle and the plain reference); ``input_sets``: copies of the inputs a speed test rotates over."""
    element = _ELEMENT_BYTES.get(case.dtype, 4)
    scores = score_elements(case)
    tensors = tensor_elements(case, backward=backward)
    total = tensors * element * max(1, input_sets)
    if not linear_memory:
        total += scores * 4 * (2 if backward else 1)
    if references:
        total += tensors * (element + 8)  # the inputs' snapshots, and the oracle's float64 upcasts
        total += scores * (8 + element) * (7 if backward else 3)  # oracle and plain: scores, probs (and grads)
    return int(total)


def budget_bytes(device_memory_bytes: int | None, workers: int) -> int | None:
    """What the requests' estimates may add up to on a device of this size (None: no limit known)."""
    if not device_memory_bytes:
        return None
    usable = int(device_memory_bytes * DEVICE_SHARE) - workers * WORKER_RESERVE_BYTES
    return max(usable, device_memory_bytes // 4)
