"""Speed, as the worker takes it: one case timed in one mode, and the machine's ceilings.

The inputs are made outside the timed region, and successive calls rotate over copies of them
(:func:`input_set_count`); the timer is :mod:`pytest_attnkit.worker.timer`. The first call is held
to the contract (:mod:`pytest_attnkit.worker.calls`) once the warm-up is done: a call that returns
the wrong shape or modifies its inputs gets no figure, and no timed call carries a check.

A backward sample runs ``torch.autograd.grad`` once on a graph of its own, whose forward ran just
before, outside the timed region (the timer's ``prepare``): a graph is run backward once and
freed, as in training, so a compiled backward that donates its saved buffers (torch.compile's
default, which refuses ``retain_graph=True``) is timed like any other, and no gradient
accumulates across samples. Switching ``torch._functorch.config.donated_buffer`` off instead (as
tritonbench does) would change the kernel under test, and only for kernels compiled after the
switch in this process. What a case counts
(FLOPs, bytes) is :mod:`pytest_attnkit.counts`, shared with the pytest process.

The machine's ceilings are measured in the same run (:func:`measure_ceilings`): a large bf16
matmul for TFLOP/s and a large device-to-device copy for GB/s, counting bytes read and written.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from typing import Any, Iterator

from pytest_attnkit.contract import AttentionImpl, Case
from pytest_attnkit.counts import byte_count

#: On the GPU the timed calls rotate over up to this many copies of the inputs (the same values at
#: different addresses), using at most ``INPUT_SETS_BYTES`` for them: a call's time can depend on
#: where its inputs happen to be allocated, and a median over placements does not carry one
#: placement's luck from run to run (docs/speed.md: the timer).
INPUT_SETS = 4
INPUT_SETS_BYTES = 6 * 2**30


def input_set_count(case: Case, mode: str, device: str) -> int:
    """How many copies of the inputs the timed calls rotate over (1 on the CPU)."""
    if device != "cuda":
        return 1
    return max(1, min(INPUT_SETS, INPUT_SETS_BYTES // byte_count(case, mode)))


def measure_speed(impl: AttentionImpl, case: Case, mode: str, *, device: str, seed: int,
                  budget_ms: float, hold_stream: bool = True, input_sets: int | None = None,
                  call_limit_ms: float | None = None, first_call_limit_ms: float | None = None) -> dict[str, Any]:
    """Time one case in one mode. Inputs are made once, outside the timed region; successive calls
    take the next of ``input_sets`` copies (default: :func:`input_set_count`). A backward call
    runs the backward of a graph built for it alone (see the module docstring).

    ``syncs`` says whether a call synchronizes the host with the device (:class:`SyncWatch`).
    With ``call_limit_ms``, a call whose warm-up took longer is not sampled: the reply says how
    long it took (``over_limit_ms``) instead of a timing (``pytest_attnkit.cases.CALL_LIMIT_MS``).
    With ``first_call_limit_ms``, a first call that took longer says so alone, without a second
    call (the pytest side asks it where the implementation's first calls show no setup:
    pytest_attnkit/controller/speed.py, FIRST_CALL_MARGIN)."""
    call, prepare, sets, first = _timed_call(impl, case, mode, device=device, seed=seed, input_sets=input_sets)
    watch = SyncWatch(device)
    warmed = first.warm_up(call, device, hold_stream=hold_stream, prepare=prepare, watch=watch,
                           stop_over_ms=first_call_limit_ms)  # checks the first call: one that breaks
    # the contract gets no figure
    if warmed.stopped or (call_limit_ms is not None and warmed.long_call and warmed.last_ms is not None
                          and warmed.last_ms > call_limit_ms):
        return {"over_limit_ms": round(warmed.last_ms, 1), "input_sets": sets}
    syncs = watch.found(call, prepare)
    count = warmed.sample_count(budget_ms)
    return {"timing": warmed.timing(warmed.samples(count)).to_dict(), "input_sets": sets, "syncs": syncs}


def warm_speed(impl: AttentionImpl, case: Case, mode: str, *, device: str, seed: int,
               hold_stream: bool = True) -> tuple[Any, int, str | None]:
    """The case's call, warmed up and ready to be sampled in blocks (an A/B run), with the number
    of input sets it rotates over (the same inputs, flush and hold as :func:`measure_speed`), and
    what :class:`SyncWatch` found."""
    call, prepare, sets, first = _timed_call(impl, case, mode, device=device, seed=seed, input_sets=None)
    watch = SyncWatch(device)
    warmed = first.warm_up(call, device, hold_stream=hold_stream, prepare=prepare, watch=watch)
    return warmed, sets, watch.found(call, prepare)


class SyncWatch:
    """Whether a call synchronizes the host with the device (a ``.tolist()``, an ``.item()``):
    torch's first warning of it in sync debug mode, or None. Such a call's time follows its
    process's host speed, which an A/B run's pairing cannot cancel (pytest_attnkit/controller/paired.py).

    The timer's warm-up runs its calls after the first in it (:func:`pytest_attnkit.worker.timer.warm_up`),
    so no call is made for it alone; where the warm-up made none, :meth:`found` makes one. Under
    the watch each synchronization also raises a warning, which costs the host microseconds: the
    warm-up's own figures (a long call's length, its launch time) carry that, the samples never.
    On a fresh H200 the same 12 cases read as synchronizing as with a call of its own
    (results/2026-12-02-session28: cold41, cold42 against session 27's cold39)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.watched = 0
        self.warning: str | None = None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        if self.device != "cuda":
            yield
            return
        import warnings

        import torch

        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        self.watched += 1
        if self.warning is None:
            self.warning = sync_warning([str(warning.message) for warning in caught])

    def found(self, call: Any, prepare: Any) -> str | None:
        """What the watched calls showed; one call watched now if none was."""
        if self.device != "cuda":
            return None
        if not self.watched:
            import torch

            if prepare is not None:
                prepare()
                torch.cuda.synchronize()
            with self():
                call()
            torch.cuda.synchronize()
        return self.warning


def sync_warning(messages: list[str]) -> str | None:
    """The first of torch's warnings that reports a synchronizing operation, first line only, or
    None. Switching the sync debug mode on warns too ("Synchronization debug mode is a prototype
    feature and does not yet detect all synchronizing operations"): that notice says nothing of the
    call, and counting it made the first speed case of every worker "synchronizing"
    (results/2026-11-23-h200-against-proof: torch_sdpa's dense 1k forward)."""
    for message in messages:
        lowered = message.lower()
        if "synchroniz" in lowered and "prototype" not in lowered:
            return message.splitlines()[0]
    return None


def _timed_call(impl: AttentionImpl, case: Case, mode: str, *, device: str, seed: int,
                input_sets: int | None) -> tuple[Any, Any, int, "_FirstCallCheck"]:
    """(the timed call, what runs untimed before each call or None, the number of input sets, and
    the contract check of the first call, to run once the warm-up is done)."""
    from pytest_attnkit.worker.inputs import make_inputs

    backward = mode == "backward"
    sets = []
    for _ in range(input_sets or input_set_count(case, mode, device)):
        inputs = make_inputs(case, device, seed)
        q, k, v = (t.detach().requires_grad_(backward) for t in (inputs.q, inputs.k, inputs.v))
        sets.append((q, k, v, inputs))  # inputs: dout, and a variant's ALiBi slopes or sinks
    first = _FirstCallCheck(case, *sets[0])
    if backward:
        graphs = _BackwardGraphs(impl, itertools.cycle(sets), case, first)
        return graphs.backward, graphs.prepare, len(sets), first
    calls = [functools.partial(_forward, impl, case, q, k, v, inputs) for q, k, v, inputs in sets]
    rotation = itertools.cycle(calls)

    def call() -> Any:
        returned = next(rotation)()
        if first.taking:  # the first call, on the first input set: checked after the warm-up
            first.take(returned)
        return returned

    return call, None, len(calls), first


class _FirstCallCheck:
    """The contract held on a request's first call, and no other (pytest_attnkit/worker/calls.py):
    the first input set is watched from before the first call; what that call returned (a
    backward: its gradients) is kept and checked with the inputs after the warm-up, so neither the
    first call's figure nor a sample carries the check. A backward's forward output is checked
    before its graph is run backward (``check_forward``), untimed as the timer's ``prepare`` is."""

    def __init__(self, case: Case, q: Any, k: Any, v: Any, inputs: Any) -> None:
        from pytest_attnkit.worker.calls import InputWatch, given_inputs

        self.case, self.q, self.leaves = case, q, {"dq": q, "dk": k, "dv": v}
        self.watch: Any = InputWatch(given_inputs(q, k, v, inputs))
        self.returned: Any = None
        self.taking = True
        self.forward_checked = False

    def take(self, returned: Any) -> None:
        self.returned, self.taking = returned, False

    def check_forward(self, returned: Any) -> None:
        from pytest_attnkit.worker.calls import check_returned

        if not self.forward_checked:
            self.forward_checked = True
            check_returned(self.case, returned, self.q, backward=True)

    def warm_up(self, call: Any, device: str, *, hold_stream: bool, prepare: Any, watch: "SyncWatch",
                stop_over_ms: float | None = None) -> Any:
        """The timer's warm-up of ``call`` (its later calls under ``watch``), then :meth:`check`;
        where the warm-up raises and the inputs changed, the change is reported (autograd's
        complaint about an in-place change is its consequence)."""
        from pytest_attnkit.worker.timer import warm_up

        with self.watch.blaming():
            warmed = warm_up(call, device, hold_stream=hold_stream, prepare=prepare, watch=watch,
                             stop_over_ms=stop_over_ms)
        self.check()
        return warmed

    def check(self) -> None:
        """Raise :class:`~pytest_attnkit.worker.calls.ContractViolation` for a breach in the first call."""
        from pytest_attnkit.worker.calls import check_gradients, check_returned

        if self.watch is None:
            return
        returned, self.returned = self.returned, None
        if self.forward_checked:
            check_gradients(self.leaves, returned)
        else:
            check_returned(self.case, returned, self.q)
        self.watch.check()
        self.watch = None


class _BackwardGraphs:
    """One autograd graph per backward call: ``prepare`` runs the forward on the next input set
    (untimed), ``backward`` runs that graph's backward once, freeing it (timed)."""

    def __init__(self, impl: AttentionImpl, rotation: Any, case: Case, first: _FirstCallCheck) -> None:
        self.impl, self.rotation, self.case, self.first = impl, rotation, case, first
        self.pending: tuple[Any, tuple[Any, Any, Any], Any] | None = None

    def prepare(self) -> None:
        import torch

        from pytest_attnkit.worker.calls import call_implementation

        q, k, v, inputs = next(self.rotation)
        self.pending = None  # a graph left unused (never, with the timer) is dropped before the next is built
        with torch.enable_grad():
            returned = call_implementation(self.impl, self.case, q, k, v, inputs)
        self.first.check_forward(returned)
        out = returned[0] if self.case.return_lse else returned
        self.pending = (out, (q, k, v), inputs.dout)

    def backward(self) -> Any:
        import torch

        if self.pending is None:
            raise RuntimeError("a backward sample without its graph: the timer must call prepare before each call")
        out, inputs, dout = self.pending
        self.pending = None
        grads = torch.autograd.grad(out, inputs, dout, allow_unused=True)
        if self.first.taking:
            self.first.take(grads)
        return grads


def _forward(impl: AttentionImpl, case: Case, q: Any, k: Any, v: Any, inputs: Any) -> Any:
    import torch

    from pytest_attnkit.worker.calls import call_implementation

    with torch.no_grad():
        return call_implementation(impl, case, q, k, v, inputs)


def measure_ceilings(device: str) -> dict[str, Any]:
    """This machine's matmul TFLOP/s and copy GB/s, measured now with the same timer."""
    import torch

    from pytest_attnkit.worker.timer import time_call

    if device != "cuda":
        return {}
    size = 8192
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16, generator=generator)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16, generator=generator)
    matmul = time_call(lambda: torch.matmul(a, b), device, budget_ms=300)
    del a, b
    source = torch.empty(2**30 // 4, device="cuda", dtype=torch.float32).normal_(generator=generator)
    target = torch.empty_like(source)
    copy = time_call(lambda: target.copy_(source), device, budget_ms=300)
    ceilings = {
        "matmul_bf16_tflops": 2 * size**3 / (matmul.median_ms * 1e-3) / 1e12,
        "copy_gbps": 2 * source.numel() * 4 / (copy.median_ms * 1e-3) / 1e9,
    }
    del source, target
    torch.cuda.empty_cache()
    return ceilings


def gpu_state() -> dict[str, Any]:
    """Clocks and temperature where NVML gives them (through torch's wrappers)."""
    import torch

    state: dict[str, Any] = {}
    for key, read in (("sm_clock_mhz", "clock_rate"), ("temperature_c", "temperature"), ("power_w", "power_draw")):
        try:
            value = getattr(torch.cuda, read)()
        except Exception:  # no NVML, or this torch lacks the wrapper
            continue
        state[key] = value / 1000 if key == "power_w" else value
    return state


def gpu_processes(earlier: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The other processes that compute on this worker's GPU, as NVML lists them now (joined with
    ``earlier``, a list taken before the timing): ``{"others": [pid, ...]}``, leaving out this
    worker and every process it started. A speed run that shares its GPU times the other
    processes' work too (the pytest side leaves out its other workers: speed timing has the GPU
    to itself, but their idle CUDA contexts are listed). None where NVML cannot tell: no NVML,
    or a container whose process ids are not the driver's (this worker is not in the list)."""
    from pytest_attnkit.worker import nvml

    device = nvml.device()
    if device is None:
        return earlier
    import os

    from pytest_attnkit.descendants import descendants

    now = other_processes(*device, os.getpid(), set(descendants(os.getpid())))
    if earlier is None or now is None:
        return now or earlier
    return {"others": sorted(set(earlier["others"]) | set(now["others"]))}


def other_processes(nvml: Any, handle: Any, own_pid: int, started: set[int]) -> dict[str, Any] | None:
    """The compute processes NVML lists on ``handle``, less ``own_pid`` and the processes it
    ``started``; None when ``own_pid`` is not among them (NVML's ids are of another namespace)."""
    try:
        listed = {int(process.pid) for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    except Exception:
        return None
    if own_pid not in listed:
        return None
    return {"others": sorted(listed - {own_pid} - started)}


#: The fields of a kernel launch that say which program ran (from the profiler's trace).
_LAUNCH_FIELDS = (("grid", "grid"), ("block", "block"), ("smem", "shared memory"), ("regs", "registers per thread"))


def kernel_program(impl: AttentionImpl, case: Case, mode: str, *, seed: int) -> str | None:
    """The kernels one call of the case launches, as ``name grid=.. block=.. smem=.. regs=..``
    joined by " | " (those that take at most 1% of the call's kernel time together marked minor:
    :mod:`pytest_attnkit.programs`), read from torch's profiler after a first call: which program
    a compiled kernel became in this process. None where the profiler gives no kernel events."""
    import json
    import os
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    call, prepare, _, first = _timed_call(impl, case, mode, device="cuda", seed=seed, input_sets=1)
    if prepare is not None:
        prepare()
    call()  # compiled and loaded before the profile
    first.check()
    if prepare is not None:
        prepare()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        call()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        trace = os.path.join(folder, "trace.json")
        profiler.export_chrome_trace(trace)
        with open(trace, encoding="utf-8") as stream:
            events = json.load(stream).get("traceEvents", [])
    return program_of(events)


def program_of(events: list[dict[str, Any]]) -> str | None:
    """The program of a profiled call from its chrome-trace events (:func:`kernel_program`): its
    kernel events in time order, each with its launch fields and duration, the minor ones marked
    (:func:`pytest_attnkit.programs.describe`)."""
    from pytest_attnkit.programs import describe

    launches: list[tuple[str, float]] = []
    for event in sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e.get("ts", 0)):
        args = event.get("args", {})
        fields = " ".join(f"{short}={args[name]}".replace(" ", "") for short, name in _LAUNCH_FIELDS if name in args)
        launches.append((f"{event.get('name', '?')} {fields}".strip(), event.get("dur") or 0.0))
    return describe(launches)
