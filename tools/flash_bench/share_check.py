"""Does a kernel survive a shared GPU? Several processes call kernels at once; each reports its calls
as it goes, and one that stops reporting is named as hung.

Why: the harness's workers share the GPU, which time-slices their kernels, and the Gluon backward
hung there while it ran right alone (implementations/triton_flash/NOTES.md v26: two processes calling
it at once both spun forever within seconds; one alone ran 3000 calls). A single-process check
cannot see that.

Usage, on the GPU machine, from the repository root:

    python3 tools/flash_bench/share_check.py --run "bwd d128 causal" --run "bwd d128 causal" \\
        [--seconds 30] [--stall 10] [--out FILE.json]

Each ``--run`` is one process; its words:

- a kind:
  - ``fwd``: triton_flash's forward as ``launch.flash_fwd`` takes it (the Gluon kernel on Hopper).
  - ``bwd``: the Gluon backward (``gluon_backward.flash_bwd``) on that forward's output.
  - ``tbwd``: the Triton backward (``launch.flash_bwd`` with ``gluon=False``).
  - ``sleep``: ``torch.cuda._sleep``, a partner that only makes the GPU switch between processes.
  - ``spin`` and ``stall``: no GPU. They stand in for a running kernel and a hung one, for this
    tool's own tests.
- ``dN`` (head dim: 64, 128, 192 = MLA with V's 128), ``causal``, ``bN``, ``hN``, ``nN`` (batch,
  heads, sequence length; default b4 h16 n4096, bf16);
- ``config=TEXT``: a backward configuration (``gluon_backward.Config.parse``).

Each process first compiles and times one call, says it is ready, and waits. Once every process is
ready (or the compile deadline passes), all start together. Each then calls its kernel for
``--seconds``, synchronizing only after every few calls, so that every process's queue stays full
and the GPU has to switch between them in the middle of kernels. (A first version read each call's
comparison on the host; the kernel before the v26 fix then ran 7060 calls in two processes without
hanging: results/2026-11-29-session20.) It reports its count and whether every result
was bitwise the first one. A result that differs is a "mismatch": float atomics may differ run to
run, so the backward's dQ is left out of the comparison and dK and dV are compared.

A process whose count has not moved for ``--stall`` seconds is named as hung. The tool reads the
GPU's utilization, SM clock and power then (a spin draws little power). The others go on until
they finish or stall too; then every process is stopped.

Exit status: 0 all finished with no mismatch, 1 a mismatch, 2 a hang, 3 a process failed to start
or crashed, 4 a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
KINDS = ("fwd", "bwd", "tbwd", "sleep", "spin", "stall")
#: Calls between two reports (each report synchronizes).
CALLS_A_REPORT = 10


@dataclass
class Spec:
    """One process's kernel and shape."""

    kind: str
    head_dim: int = 128
    causal: bool = False
    batch: int = 4
    heads: int = 16
    n: int = 4096
    config: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Spec":
        words = text.split()
        if not words or words[0] not in KINDS:
            raise ValueError(f"--run {text!r}: the first word is the kind, one of {', '.join(KINDS)}")
        spec = cls(words[0])
        for word in words[1:]:
            if word == "causal":
                spec.causal = True
            elif word.startswith("config="):
                spec.config = word.split("=", 1)[1]
            elif word[:1] in "dbhn" and word[1:].isdigit():
                setattr(spec, {"d": "head_dim", "b": "batch", "h": "heads", "n": "n"}[word[0]], int(word[1:]))
            else:
                raise ValueError(f"--run {text!r}: {word!r} is not dN, bN, hN, nN, causal or config=TEXT")
        return spec

    def __str__(self) -> str:
        """The words :meth:`parse` reads back (the child is started with them)."""
        if self.kind in ("sleep", "spin", "stall"):
            return self.kind
        text = f"{self.kind} d{self.head_dim} b{self.batch} h{self.heads} n{self.n}{' causal' if self.causal else ''}"
        return text + (f" config={self.config}" if self.config else "")


# ---------------------------------------------------------------------------------------------
# Child side (the only part that touches CUDA)
# ---------------------------------------------------------------------------------------------


def _emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def _call_for(spec: Spec):
    """(one call returning what is compared, or None for nothing, and a synchronize)."""
    if spec.kind == "spin":
        return (lambda: sum(range(20000)) and None), (lambda: None)
    if spec.kind == "stall":  # its first call returns, the next never does
        calls = []
        return (lambda: calls.append(1) or (time.sleep(3600) if len(calls) > 1 else None)), (lambda: None)
    import torch

    if spec.kind == "sleep":
        return (lambda: torch.cuda._sleep(1_000_000)), torch.cuda.synchronize
    sys.path.insert(0, str(REPO))
    from implementations.triton_flash import gluon_backward, launch

    generator = torch.Generator(device="cuda").manual_seed(0)
    value_dim = 128 if spec.head_dim == 192 else spec.head_dim

    def normal(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=generator)

    q, k = normal(spec.batch, spec.heads, spec.n, spec.head_dim), normal(spec.batch, spec.heads, spec.n, spec.head_dim)
    v, do = normal(spec.batch, spec.heads, spec.n, value_dim), normal(spec.batch, spec.heads, spec.n, value_dim)
    scale = spec.head_dim ** -0.5
    if spec.kind == "fwd":
        return (lambda: launch.flash_fwd(q, k, v, spec.causal, scale)[0]), torch.cuda.synchronize
    o, lse = launch.flash_fwd(q, k, v, spec.causal, scale)
    if spec.kind == "tbwd":
        return (lambda: torch.cat([g.flatten() for g in launch.flash_bwd(do, q, k, v, o, lse, spec.causal, scale,
                                                                             gluon=False)[1:3]])), torch.cuda.synchronize
    reason = gluon_backward.unsupported_reason(q, k, v, spec.causal, scale)
    if reason is not None:
        raise RuntimeError(f"the Gluon backward does not take {spec}: {reason}")
    config = gluon_backward.Config.parse(spec.config) if spec.config else None
    return (lambda: torch.cat([g.flatten() for g in gluon_backward.flash_bwd(do, q, k, v, o, lse, spec.causal, scale,
                                                                           config)[1:]])), torch.cuda.synchronize


def child(text: str, seconds: float) -> int:
    spec = Spec.parse(text)
    call, synchronize = _call_for(spec)
    started = time.perf_counter()
    first = call()
    synchronize()
    _emit(event="ready", first_call_s=round(time.perf_counter() - started, 2))
    if sys.stdin.readline().strip() != "go":
        return 0
    began, calls, mismatches, differed = time.perf_counter(), 0, 0, None
    while time.perf_counter() - began < seconds:
        for _ in range(CALLS_A_REPORT):
            got = call()
            if first is not None and got is not None:
                # Counted on the GPU: reading a verdict per call would wait on the host after every
                # kernel, and the GPU would then switch processes only between kernels.
                one = (got != first).any()
                differed = one.int() if differed is None else differed + one
            calls += 1
        synchronize()
        if differed is not None:
            mismatches = int(differed.item())
        _emit(event="calls", calls=calls, mismatches=mismatches, at=round(time.perf_counter() - began, 2))
    _emit(event="done", calls=calls, mismatches=mismatches, seconds=round(time.perf_counter() - began, 2))
    return 0


# ---------------------------------------------------------------------------------------------
# Parent side (no CUDA)
# ---------------------------------------------------------------------------------------------


@dataclass
class Process:
    spec: Spec
    popen: subprocess.Popen
    stderr: Any
    events: "queue.Queue[dict | None]" = field(default_factory=queue.Queue)
    ready: dict | None = None
    last: dict | None = None
    moved_at: float = 0.0
    done: bool = False
    ended: bool = False

    def read(self) -> None:
        for line in self.popen.stdout:
            try:
                self.events.put(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line the kernel's libraries printed
        self.events.put(None)

    def drain(self, now: float) -> None:
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            if event is None:
                self.ended = True
            elif event["event"] == "ready":
                self.ready = event
            else:
                self.last, self.moved_at = event, now
                self.done |= event["event"] == "done"


def gpu_reading() -> str | None:
    """nvidia-smi's utilization, SM clock and power, or None without it."""
    try:
        result = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,clocks.sm,power.draw",
                                 "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None


def run(specs: list[Spec], seconds: float, stall: float, compile_deadline: float, log) -> dict:
    """Start one process a spec, start them together once all are ready, watch them: the record."""
    processes = []
    for spec in specs:
        stderr = tempfile.TemporaryFile(mode="w+")  # read back for a process that crashed
        popen = subprocess.Popen([sys.executable, __file__, "--child", str(spec), "--seconds", str(seconds)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                 text=True, cwd=REPO, start_new_session=True)
        process = Process(spec, popen, stderr)
        threading.Thread(target=process.read, daemon=True).start()
        processes.append(process)
    record: dict = {"specs": [str(s) for s in specs], "seconds": seconds, "stall": stall}
    deadline = time.monotonic() + compile_deadline
    while time.monotonic() < deadline:
        now = time.monotonic()
        for process in processes:
            process.drain(now)
        if all(p.ready or p.ended for p in processes):
            break
        time.sleep(0.2)
    started = time.monotonic()
    for process in processes:
        process.moved_at = started
        if process.ready and not process.ended:
            process.popen.stdin.write("go\n")
            process.popen.stdin.flush()
    log(f"started {sum(bool(p.ready) for p in processes)} of {len(processes)} at once")
    hung_reading = None
    while True:  # until every process has finished, ended or stalled
        time.sleep(0.5)
        now = time.monotonic()
        for process in processes:
            process.drain(now)
        live = [p for p in processes if p.ready and not p.done and not p.ended]
        stalled = [p for p in live if now - p.moved_at > stall]
        if stalled and hung_reading is None:
            hung_reading = gpu_reading()  # while it spins
        if len(stalled) == len(live):
            break
    now = time.monotonic()
    for process in processes:
        if process.popen.poll() is None:
            os.killpg(process.popen.pid, signal.SIGKILL)
        process.popen.wait()
    record["gpu_at_the_stall"] = hung_reading
    rows = []
    for process in processes:
        last = process.last or {}
        process.stderr.seek(0)
        said = [line.strip() for line in process.stderr.read().splitlines() if line.strip()]
        why = f": {said[-1][:200]}" if said else ""
        if process.ready is None:
            verdict = ("crashed before its first call" + why if process.ended
                       else "did not make its first call within the compile deadline")
        elif process.done:
            verdict = "ok"
        elif process.ended:
            verdict = f"crashed (exit {process.popen.returncode}){why}"
        else:
            verdict = f"HUNG: no call finished in the last {now - process.moved_at:.0f} s"
        rows.append({"spec": str(process.spec), "first_call_s": (process.ready or {}).get("first_call_s"),
                     "calls": last.get("calls", 0), "mismatches": last.get("mismatches", 0), "verdict": verdict})
    record["processes"] = rows
    return record


def status(record: dict) -> int:
    verdicts = [row["verdict"] for row in record["processes"]]
    if any(v.startswith(("did not make", "crashed")) for v in verdicts):
        return 3
    if any(v.startswith("HUNG") for v in verdicts):
        return 2
    return 1 if any(row["mismatches"] for row in record["processes"]) else 0


class Parser(argparse.ArgumentParser):
    """Usage errors exit 4 (2 is a hang here)."""

    def error(self, message: str):  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(4, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", default=[], metavar="SPEC", help="one process (see above)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each process calls (default 30)")
    parser.add_argument("--stall", type=float, default=10.0,
                        help="seconds with no call finished that name a process hung (default 10)")
    parser.add_argument("--compile-deadline", type=float, default=300.0,
                        help="seconds the processes get to compile and make their first call (default 300)")
    parser.add_argument("--out", help="write the record here as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.seconds)
    if not args.run:
        parser.error("give at least one --run")
    try:
        specs = [Spec.parse(text) for text in args.run]
    except ValueError as error:
        parser.error(str(error))
    record = run(specs, args.seconds, args.stall, args.compile_deadline, lambda text: print(text, flush=True))
    for row in record["processes"]:
        first = "-" if row["first_call_s"] is None else f"{row['first_call_s']} s"
        print(f"  {row['spec']}: first call {first}, {row['calls']} calls, {row['mismatches']} mismatches")
        print(textwrap.fill(row["verdict"], 100, initial_indent="      ", subsequent_indent="      "))
    if record["gpu_at_the_stall"]:
        print(f"  GPU at the stall (utilization, SM clock, power): {record['gpu_at_the_stall']}")
    code = status(record)
    record["exit_status"] = code
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1))
    print(f"exit status {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
