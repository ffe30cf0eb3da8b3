"""What the Gluon forward's and backward's tools share: the GPU checks' child processes
(``gluon_check.py``, ``gluon_bwd_check.py``) and the CPU models' barriers and interleavings
(``gluon_model.py``, ``gluon_bwd_model.py``). Standard library only: the parent side of a check
and the models run where torch has no GPU.

Child processes. A check runs its cases in children of its own script (``SCRIPT --child MODE
CASES``), which print one JSON event a line: ``hello`` (the device), ``start`` and ``result`` per
case, ``compiled`` per kernel (``compile_error`` for one that raised: that case fails alone). The parent (:func:`run_cases`) gives each case a deadline: on the
first case past it the child is killed and the run stops there (a warp-specialized kernel that is
wrong usually hangs); a crash is recorded and the next case runs in a fresh child.
:func:`compile_all` compiles in parallel children. ``selftest`` children (:func:`selftest_child`)
plant results, a crash and a hang, to check the parent without a GPU. :func:`check_main` is a
check's whole parent after its arguments (:func:`check_parser`, :func:`check_record`): compile,
correctness, timing, report.

Models. :class:`MBarrier` is an mbarrier's arithmetic; :func:`interleave` runs a kernel's
partitions, written as generators that yield ``("wait", barrier, parity)`` or ``("yield",)``, in
one random order to the end, landing the TMA copies in flight at random points too.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# Child side
# ---------------------------------------------------------------------------------------------


def emit(event: str, **fields) -> None:
    """One event to the parent: a JSON line on stdout."""
    print(json.dumps({"event": event, **fields}), flush=True)


def hello() -> None:
    """The ``hello`` event: the GPU, torch, triton and CUDA."""
    import torch
    import triton

    props = torch.cuda.get_device_properties(0)
    emit("hello", device=props.name, capability=list(torch.cuda.get_device_capability(0)),
         sms=props.multi_processor_count, torch=torch.__version__, triton=triton.__version__,
         cuda=torch.version.cuda)


def selftest_child(cases: list[dict]) -> int:
    """A child for the parent's selftest, without a GPU: each case passes, crashes the child
    (``crash``) or hangs (``hang``)."""
    emit("hello", device="none")
    for case in cases:
        emit("start", id=case["id"])
        if case.get("hang"):
            time.sleep(3600)
        if case.get("crash"):
            os._exit(7)
        emit("result", id=case["id"], passed=True, error="selftest")
    return 0


def compile_each(cases: list[dict], compile_one) -> int:
    """Compile each case (``compile_one(case)``), emitting ``compiled`` with its seconds, or
    ``compile_error`` with why: one configuration that refuses its case (``-bx16`` at d64) fails
    that case alone, and the child goes on with the others in its group."""
    for case in cases:
        start = time.perf_counter()
        try:
            compile_one(case)
        except Exception as exc:
            emit("compile_error", id=case["id"], error=f"{type(exc).__name__}: {str(exc)[:500]}")
            continue
        emit("compiled", id=case["id"], seconds=round(time.perf_counter() - start, 1))
    return 0


def run_each(cases: list[dict], run_one) -> int:
    """Run ``run_one(case)`` (a dict of results) for each case between its ``start`` and
    ``result`` events. An exception fails the case in words and the run goes on; one from CUDA
    ends the child with status 4 (the context may be poisoned: the parent goes on in a fresh
    one)."""
    for case in cases:
        emit("start", id=case["id"])
        try:
            result = run_one(case)
        except Exception as exc:  # the case fails in words; the run goes on
            emit("result", id=case["id"], passed=False, error=f"{type(exc).__name__}: {str(exc)[:1500]}")
            if "CUDA" in str(exc) or "cuda" in type(exc).__module__:
                return 4  # the context may be poisoned: the parent goes on in a fresh child
            continue
        emit("result", id=case["id"], **result)
    return 0


# ---------------------------------------------------------------------------------------------
# Parent side (no CUDA here)
# ---------------------------------------------------------------------------------------------


class Child:
    """One child process of ``script`` running ``mode`` over ``cases``, read line by line with
    deadlines."""

    def __init__(self, script: Path, mode: str, cases: list[dict], out: Path, tag: str) -> None:
        self.cases_path = out / f"{tag}.cases.json"
        self.cases_path.write_text(json.dumps(cases))
        self.stderr = open(out / f"{tag}.stderr", "a")
        self.process = subprocess.Popen(
            [sys.executable, "-u", str(Path(script).resolve()), "--child", mode, str(self.cases_path)],
            stdout=subprocess.PIPE, stderr=self.stderr, text=True, start_new_session=True, cwd=str(REPO))
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_event(self, timeout: float) -> dict | None:
        """The next event; None when the child exited; raises queue.Empty past the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                return None
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue  # a stray print of a library

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self.stderr.close()

    def close(self) -> None:
        self.process.wait(timeout=60)
        self.stderr.close()


def run_cases(script: Path, mode: str, cases: list[dict], out: Path, timeout: float, log,
              describe) -> tuple[dict, dict, str | None]:
    """Run ``cases`` in children of ``script``: (results by id, the device's hello, the id of a
    hung case). ``describe(mode, event)`` is the line logged for each result."""
    results: dict = {}
    device: dict = {}
    pending = list(cases)
    attempt = 0
    while pending:
        attempt += 1
        child_process = Child(script, mode, pending, out, f"{mode}-{attempt}")
        current = None
        while True:
            try:
                event = child_process.next_event(timeout if current else max(timeout, 120.0))
            except queue.Empty:
                child_process.kill()
                if current is None:
                    log(f"  the {mode} child did not start within {max(timeout, 120.0):.0f} s")
                    return results, device, "startup"
                results[current] = {"passed": False, "error": f"HUNG: no result within {timeout:.0f} s"}
                log(f"  HANG: {current} gave no result within {timeout:.0f} s; the child was killed, the run stops")
                return results, device, current
            if event is None:  # exited: done, or crashed inside `current`
                child_process.close()
                break
            if event["event"] == "hello":
                device = event
            elif event["event"] == "start":
                current = event["id"]
            elif event["event"] == "result":
                results[event["id"]] = event
                log(describe(mode, event))
                current = None
        done = [case for case in pending if case["id"] in results]
        if current is not None:
            results[current] = {"passed": False, "error": f"the child died in this case (exit "
                                                         f"{child_process.process.returncode}; see {mode}-{attempt}.stderr)"}
            log(f"  CRASH in {current}: exit {child_process.process.returncode}, see {mode}-{attempt}.stderr")
        pending = [case for case in pending if case["id"] not in results]
        if pending and not done and current is None:
            log(f"  the {mode} child exited before its first case (see {mode}-{attempt}.stderr)")
            for case in pending:
                results[case["id"]] = {"passed": False, "error": "the child exited before running it"}
            break
    return results, device, None


def compile_all(script: Path, specs: list[dict], out: Path, log) -> dict:
    """Compile every kernel in parallel children of ``script`` (compilation is single-threaded per
    kernel): the seconds each took, by id."""
    workers = max(1, min(len(specs), os.cpu_count() or 1, 16))
    groups = [specs[i::workers] for i in range(workers)]
    children = [Child(script, "compile", group, out, f"compile-{i}") for i, group in enumerate(groups) if group]
    seconds: dict = {}
    errors: dict = {}
    deadline = time.monotonic() + 600
    for child_process, group in zip(children, groups):
        while True:
            try:
                event = child_process.next_event(max(1.0, deadline - time.monotonic()))
            except queue.Empty:
                child_process.kill()
                break
            if event is None:
                child_process.close()
                break
            if event.get("event") == "compiled":
                seconds[event["id"]] = event["seconds"]
            elif event.get("event") == "compile_error":
                errors[event["id"]] = event["error"]
        for spec in group:
            if spec["id"] in errors:
                log(f"  COMPILE FAILED: {spec['id']}: {errors[spec['id']]}")
            elif spec["id"] not in seconds:
                log(f"  COMPILE FAILED: {spec['id']} (not reached: the child ended or ran past the deadline; "
                    f"see {Path(child_process.cases_path).stem}.stderr)")
    return seconds


def config_of(case_id: str) -> str:
    """A correctness case's configuration: the bracketed end of its id."""
    return case_id.rsplit("[", 1)[-1].rstrip("]")


def run_going_on(script: Path, mode: str, cases: list[dict], out: Path, timeout: float, log, describe,
                 variants: set | None) -> tuple[dict, dict, list[str]]:
    """:func:`run_cases`, going on past a hang where the rest can still say something: in
    correctness (``variants`` given), a hang in a variant's case drops that variant's other
    cases and the rest run in a fresh child (a hang in a default's case stops the run, as
    before); in timing (``variants`` None), a hung case is left out and the others run.
    (Results, the device's hello, the hung cases' ids.)"""
    results: dict = {}
    hello: dict = {}
    hung_ids: list[str] = []
    pending = list(cases)
    while pending:
        got, device, hung = run_cases(script, mode, pending, out, timeout, log, describe)
        results.update(got)
        hello = hello or device
        if not hung:
            break
        hung_ids.append(hung)
        if hung == "startup":
            break
        dropped = None
        if variants is not None:
            dropped = config_of(hung)
            if dropped not in variants:
                break
            log(f"  going on without {dropped}")
        pending = [case for case in pending if case["id"] not in results
                   and (dropped is None or case.get("config") != dropped)]
    return results, hello, hung_ids


def check_parser(doc: str, what: str, default_variants: str):
    """A GPU check's argument parser with the options both checks have (``--out``,
    ``--variants`` of ``what`` configurations, ``--case-timeout``, ``--skip-timing``); the tool adds
    its own, then ``--child``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", metavar="DIR", help="folder for the results (created; required)")
    parser.add_argument("--variants", default=default_variants, metavar="CFGS",
                        help=f"comma-separated {what} configurations to check and time beside the default "
                             f"(default: {default_variants}; '' for none)")
    parser.add_argument("--case-timeout", type=float, default=60.0, metavar="S",
                        help="seconds a case may take before it counts as hung (default 60)")
    parser.add_argument("--skip-timing", action="store_true", help="correctness only")
    return parser


def check_record(variants: list[str], **extra) -> dict:
    """The start of a check's check.json: the command, the date, the variants and ``extra``."""
    return {"command": " ".join([Path(sys.executable).name, *sys.argv]),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "variants": variants, **extra}


def check_main(script: Path, args, title: str, record: dict, specs: list[dict], cases: list[dict],
               bench_cases, report, describe, going_on: bool) -> int:
    """A GPU check's parent, after its arguments: compile ``specs``, run the correctness
    ``cases``, time ``bench_cases(variants to time)`` unless a case hung or ``args.skip_timing``,
    and write ``report(correct, bench, hello, variants not timed, hung ids)`` (the text) with a
    header naming ``title`` to ``args.out``'s check.md, ``record`` (command, date, variants, ...,
    then every result) to check.json and the compile times to compile.log. ``describe(mode,
    event)`` is the line logged for each result. With ``going_on`` (:func:`run_going_on`), a
    variant's hang drops that variant only, a variant that failed or hung a case is not timed and a
    hung timing case is left out; without, the first hang stops the phase (and the timing after a
    correctness hang). The exit status: 0 all passed, 1 a failed case, 2 a hang, 3 a compile
    failure."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(text: str) -> None:
        print(text, flush=True)

    variants = record["variants"]
    started = time.time()
    log("== compile (parallel children)")
    t0 = time.time()
    compiled = compile_all(script, specs, out, log)
    record["compile"] = {"seconds_wall": round(time.time() - t0, 1), "kernels": compiled,
                         "failed": [s["id"] for s in specs if s["id"] not in compiled]}
    log(f"  {len(compiled)} of {len(specs)} kernels compiled in {time.time() - t0:.0f} s")
    (out / "compile.log").write_text(json.dumps(record["compile"], indent=1))
    status = 3 if record["compile"]["failed"] else 0

    log("== correctness")
    if going_on:
        correct, hello, hung_list = run_going_on(script, "correct", cases, out, args.case_timeout, log, describe,
                                                 set(variants))
        hung = next((h for h in hung_list if not h.endswith("]") or config_of(h) not in variants), None)
    else:
        correct, hello, hung = run_cases(script, "correct", cases, out, args.case_timeout, log, describe)
        hung_list = [hung] if hung else []
    record["device"] = hello
    record["correct"] = correct
    if hung_list:
        status = 2
    elif any(not r.get("passed") for r in correct.values()):
        status = max(status, 1)
    bad: list[str] = []
    if going_on:
        # A variant that hung or failed a case is not timed (the defaults' cases stop the run as before).
        bad = sorted({config_of(case_id) for case_id, r in correct.items() if not r.get("passed")} & set(variants))
        record["variants_not_timed"] = bad

    bench: dict = {}
    if hung:
        log(f"== timing skipped: {hung} hung")
    elif args.skip_timing:
        log("== timing skipped (--skip-timing)")
    else:
        log("== timing" + (f" (not timed, failed or hung: {', '.join(bad)})" if bad else ""))
        timing = bench_cases([v for v in variants if v not in bad])
        if going_on:
            bench, _, hung_bench = run_going_on(script, "time", timing, out, args.case_timeout, log, describe, None)
        else:
            bench, _, hung_bench = run_cases(script, "time", timing, out, args.case_timeout, log, describe)
        if hung_bench:
            status = 2
    record["bench"] = bench
    record["seconds"] = round(time.time() - started, 1)

    text = report(correct, bench, hello, bad, hung_list)
    header = (f"# {title} ({record['date']})\n\n`{record['command']}` on {hello.get('device', '?')} "
              f"(torch {hello.get('torch', '?')}, triton {hello.get('triton', '?')}, CUDA {hello.get('cuda', '?')}); "
              f"{record['seconds']:.0f} s; exit status {status}.\n\n")
    (out / "check.md").write_text(header + text + "\n")
    (out / "check.json").write_text(json.dumps(record, indent=1, default=str))
    log("")
    log(text)
    log(f"\n{record['seconds']:.0f} s; results in {out}/check.md and check.json; exit status {status}")
    return status


def defaults_words(default_config) -> str:
    """A kernel's ``default_config`` choices, for a report's words: each head dim's non-causal
    default, and the causal one where it differs."""
    words = []
    for d in (128, 64):
        full, causal = default_config(d, False), default_config(d, True)
        words.append(f"{full} at d{d}" + ("" if causal == full else f" ({causal} causal)"))
    return ", ".join(words)


def case_label(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> str:
    """A timing case's name: ``b4-h32-q4096 d64 causal``."""
    return f"b{batch}-h{heads}-q{n} d{head_dim}{' causal' if causal else ''}"


def variants_table(bench: dict, variants: list[str], shapes, mark_single: bool = False) -> list[str]:
    """The report's table of configurations: TFLOP/s of the default (the ``gluon`` timing of the
    case's ``variants`` timing where it has one, else of the case) and of each of ``variants``
    (``gluon VARIANT`` in the case's ``variants`` timing). ``mark_single``: a default taken from the
    case's own timing beside variants timed in their case is marked ``*``."""
    lines = ["| case | default | " + " | ".join(variants) + " |", "|---|---|" + "---|" * len(variants)]
    for batch, heads, n, head_dim in shapes:
        for causal in (False, True):
            label = case_label(batch, heads, n, head_dim, causal)
            t = bench.get(f"{label} variants", {}).get("tflops", {})
            base = t if "gluon" in t else bench.get(label, {}).get("tflops", {})
            # A default from the case's own timing, beside variants timed in another case: marked.
            mark = "*" if mark_single and "gluon" not in t and any(f"gluon {v}" in t for v in variants) else ""
            cells = [f"{base['gluon']:.0f}{mark}" if "gluon" in base else "-"]
            cells += [f"{t[f'gluon {v}']:.0f}" if f"gluon {v}" in t else "-" for v in variants]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


class MBarrier:
    """An mbarrier: ``count`` arrivals and the expected transaction bytes complete a phase."""

    def __init__(self, name: str, count: int) -> None:
        self.name, self.count = name, count
        self.pending, self.tx, self.phase = count, 0, 0

    def _maybe_complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self) -> None:
        self.pending -= 1
        assert self.pending >= 0, f"{self.name}: more arrivals than its count"
        self._maybe_complete()

    def expect(self, nbytes: int) -> None:  # mbarrier.arrive.expect_tx
        self.tx += nbytes
        self.arrive()

    def complete_tx(self, nbytes: int) -> None:
        self.tx -= nbytes
        assert self.tx >= 0, f"{self.name}: more bytes than expected"
        self._maybe_complete()

    def passed(self, parity: int) -> bool:
        # The phase of parity `parity` has completed: the current phase's parity differs.
        return (self.phase & 1) != parity


def model_args(doc: str, seeds: int):
    """A model's arguments: ``--seeds``, the random interleavings per protocol case (default
    ``seeds``)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=seeds, help="random interleavings per protocol case")
    return parser.parse_args()


def interleave(p, partitions: dict, where: str) -> None:
    """Run ``partitions`` (name: generator) in one random order (``p.rng``) to the end, each
    blocked while its last ``("wait", barrier, parity)`` has not passed, landing ``p``'s TMA copies
    in flight (``p.in_flight``, ``p.land_one()``) at random points. AssertionError on a deadlock:
    no partition can move and no copy is in flight (``where`` names the case in its message)."""
    blocked: dict[str, tuple] = {}
    done: set[str] = set()
    while len(done) < len(partitions) or p.in_flight:
        runnable = [name for name in partitions if name not in done
                    and (name not in blocked or blocked[name][1].passed(blocked[name][2]))]
        choices = runnable + (["tma"] if p.in_flight else [])
        if not choices:
            waits = {name: (op[1].name, op[2], op[1].phase) for name, op in blocked.items()}
            raise AssertionError(f"deadlock: {where}: {waits}")
        choice = p.rng.choice(choices)
        if choice == "tma":
            p.land_one()
            continue
        blocked.pop(choice, None)
        try:
            op = next(partitions[choice])
        except StopIteration:
            done.add(choice)
            continue
        if op[0] == "wait" and not op[1].passed(op[2]):
            blocked[choice] = op
