"""The attnkit session: discovery, workers, and the verdicts the suites assert.

One :class:`AttnkitSession` lives in ``config.stash`` for a run with ``--attnkit``. It probes the
environment in a worker (the pytest process itself never imports torch or touches CUDA), picks the
device and the case set, starts one worker per selected implementation, and turns each worker
reply into a pytest outcome: pass, skip with the implementation's reasons, or fail with what went
wrong in words.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from pytest_attnkit import cases as case_sets
from pytest_attnkit.contract import Case, ImplInfo
from pytest_attnkit.options import Settings
from pytest_attnkit.registry import EntryPointRef, discover, select
from pytest_attnkit.supervisor import InProcessWorker, WorkerFailure, WorkerProcess

SESSION_KEY = pytest.StashKey["AttnkitSession"]()
NO_MEMORY_METER_ON_CPU = ("the memory suite measures the CUDA caching allocator's peaks; this run is on the CPU, "
                          "where torch keeps no peak statistics, so nothing is measured")


class AttnkitSession:
    def __init__(self, settings: Settings, rootdir: Path | None = None, config: pytest.Config | None = None) -> None:
        self.settings = settings
        self.config = config
        self.rootdir = rootdir or Path.cwd()
        self.speed: Any = None
        self.log_dir = Path(tempfile.mkdtemp(prefix="attnkit-workers-"))
        self.environment: dict[str, Any] = {}
        self.device = "cpu"
        self.profile = "smoke"
        self.refs: list[EntryPointRef] = []
        self.impls: dict[str, ImplInfo] = {}
        self.workers: dict[str, Any] = {}
        self._reported_broken: set[str] = set()
        self.memory_tables: list[list[str]] = []
        self.memory_results: list[dict[str, Any]] = []
        #: Per test: implementation, suite, outcome and the failure or skip text, for the reports.
        self.outcomes: list[dict[str, Any]] = []

    # -- start-up ---------------------------------------------------------------------------
    def start(self) -> None:
        """Discover and select implementations, probe the device, describe each implementation."""
        try:
            self.refs = select(discover(), self.settings.impl)
        except LookupError as error:
            raise pytest.UsageError(f"attnkit: {error} ({self.settings.sources['impl']})") from None
        self._probe_environment()
        self.profile = self.settings.profile if self.settings.profile != "auto" else (
            "smoke" if self.device == "cpu" else "default")
        with ThreadPoolExecutor(max_workers=max(1, len(self.refs))) as pool:
            infos = list(pool.map(self._describe, self.refs))
        self.impls = {info.name: info for info in infos}
        if "speed" in self.settings.suite:
            from pytest_attnkit.speedrun import SpeedRun

            self.speed = SpeedRun(self, self.rootdir)

    def _worker_env(self) -> dict[str, str]:
        # On the CPU, Triton kernels run in Triton's interpreter; the variable must be set before
        # triton is imported, which is why each worker gets it from the start.
        if self.device == "cpu":
            return {"TRITON_INTERPRET": "1"}
        gpu = self.pinned_gpu()
        return {"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}

    # -- pytest-xdist -----------------------------------------------------------------------
    def xdist_worker(self) -> tuple[int, int] | None:
        """(this xdist worker's index, how many there are), or None outside xdist workers."""
        workerinput = getattr(self.config, "workerinput", None)
        if not workerinput:
            return None
        index = int(str(workerinput.get("workerid", "gw0")).lstrip("gw") or 0)
        return index, int(workerinput.get("workercount", 1))

    def pinned_gpu(self) -> str | None:
        """The GPU this xdist worker's implementations run on: one per worker, round robin, so
        several GPUs share the correctness work. None outside xdist or with one visible GPU."""
        xdist = self.xdist_worker()
        count = int(self.environment.get("cuda_device_count") or 0)
        if xdist is None or count <= 1:
            return None
        visible = [part for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
        ordinals = visible if visible else [str(index) for index in range(count)]
        return ordinals[xdist[0] % len(ordinals)]

    def parallel_timing_problem(self) -> str | None:
        """Why speed cannot be timed here, or None: xdist workers sharing a GPU measure contention."""
        xdist = self.xdist_worker()
        if xdist is None:
            return None
        gpus = max(1, int(self.environment.get("cuda_device_count") or 1)) if self.device == "cuda" else 1
        if xdist[1] > gpus:
            return (f"the speed suite does not time in parallel: {xdist[1]} xdist workers share {gpus} device(s), so each "
                    "would measure the others' load; run it without -n, or with -n at most the number of GPUs")
        return None

    def _make_worker(self, label: str, init: dict[str, Any]) -> Any:
        if self.settings.inprocess:
            return InProcessWorker(label, init, env=self._worker_env())
        return WorkerProcess(label, init, self.log_dir, env=self._worker_env())

    def _probe_environment(self) -> None:
        requested = self.settings.device
        probe = self._make_worker("environment", {"device": requested})
        try:
            self.environment = probe.request({"op": "environment"}, self.settings.timeout)
        except WorkerFailure as failure:
            raise pytest.UsageError(f"attnkit: could not probe the environment: {failure}") from None
        finally:
            probe.close()
        if requested == "auto":
            self.device = "cuda" if self.environment.get("cuda_available") else "cpu"
        else:
            self.device = requested
        if self.device == "cuda" and not self.environment.get("cuda_available"):
            raise pytest.UsageError(
                f"attnkit: device cuda was asked for ({self.settings.sources['device']}) but torch sees no CUDA device "
                f"(torch {self.environment.get('torch')})"
            )

    def _describe(self, ref: EntryPointRef) -> ImplInfo:
        info = ImplInfo(name=ref.name, entry_point=ref.value, distribution=ref.distribution)
        if ref.problem:
            info.load_error = ref.problem
            return info
        worker = self._make_worker(ref.name, {"device": self.device, "name": ref.name, "value": ref.value})
        self.workers[ref.name] = worker
        try:
            described = worker.request({"op": "describe"}, self.settings.timeout)
        except WorkerFailure as failure:
            info.load_error = str(failure)
            return info
        info.load_error = described.get("load_error")
        info.unavailable = described.get("unavailable")
        info.capabilities = described.get("capabilities", {})
        return info

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()
        self.workers.clear()
        shutil.rmtree(self.log_dir, ignore_errors=True)

    # -- what the suites ask for ------------------------------------------------------------
    @property
    def impl_names(self) -> list[str]:
        return [ref.name for ref in self.refs]

    def cases(self, family: str) -> list[Case]:
        if family == "correctness":
            cases = case_sets.correctness_cases(self.profile)
        elif family in ("speed-forward", "speed-backward"):
            mode = family.split("-", 1)[1]
            cases = [case for case_mode, case in case_sets.speed_cases(self.profile) if case_mode == mode]
        else:
            raise ValueError(f"unknown case family {family!r}")
        if self.config is not None:
            self.config.hook.pytest_attnkit_modify_cases(config=self.config, family=family, cases=cases)
        return cases

    def threshold(self, impl: str, mode: str, case_id: str) -> float:
        """The gate's threshold: a conftest hook first, then the settings (ini overrides, option)."""
        from pytest_attnkit.baselines import entry_key

        default = self.settings.threshold_for(entry_key(impl, mode, case_id))
        if self.config is None:
            return default
        chosen = self.config.hook.pytest_attnkit_threshold(config=self.config, impl=impl, mode=mode,
                                                           case_id=case_id, default=default)
        return default if chosen is None else float(chosen)

    def _item_question(self, item: pytest.Item) -> tuple[str, Case, bool] | None:
        """(implementation, case, backward) that an attnkit item runs, or None for other items."""
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "attnkit_impl" not in params:
            return None
        backward = item.get_closest_marker("attnkit_backward") is not None
        if "attnkit_case" in params:
            return params["attnkit_impl"], params["attnkit_case"], backward
        if item.get_closest_marker("attnkit_memory") is not None:
            sweep = case_sets.memory_sweep(self.profile)
            return params["attnkit_impl"], sweep.case(sweep.seqlens[0]), backward
        return None

    def mark_refusals(self, items: list[pytest.Item]) -> None:
        """Mark the items an implementation refuses (unavailable, or an unsupported case) as
        skipped, with its reasons in words. One question per implementation, at collection.

        The reason leaves the case out (the test id has it), so pytest's summary groups the
        skips that share a reason."""
        questions: dict[str, list[tuple[pytest.Item, Case, bool]]] = {}
        parallel = self.parallel_timing_problem()
        for item in items:
            if self.device != "cuda" and item.get_closest_marker("attnkit_memory") is not None:
                item.add_marker(pytest.mark.skip(reason=NO_MEMORY_METER_ON_CPU))
                continue
            if parallel and item.get_closest_marker("attnkit_speed"):
                item.add_marker(pytest.mark.skip(reason=parallel))
                continue
            question = self._item_question(item)
            if question is not None:
                name, case, backward = question
                questions.setdefault(name, []).append((item, case, backward))
        for name, asked in questions.items():
            info = self.impls[name]
            if info.load_error:
                continue  # its tests fail with the load error
            if info.unavailable:
                for item, _, _ in asked:
                    item.add_marker(pytest.mark.skip(reason=f"{name} is unavailable: {info.unavailable}"))
                continue
            queries = [{"case": case.to_dict(), "backward": backward} for _, case, backward in asked]
            try:
                refusals = self.workers[name].request({"op": "support", "queries": queries}, self.settings.timeout)
            except WorkerFailure:
                continue  # each test will meet the failure itself, with the details
            for (item, _, _), refusal in zip(asked, refusals):
                if refusal:
                    item.add_marker(pytest.mark.skip(reason=f"{name} does not support it: {refusal}"))

    def _usable_worker(self, name: str) -> Any:
        info = self.impls[name]
        if info.load_error:
            if name in self._reported_broken:
                pytest.fail(f"{name} could not be loaded (the first of its tests shows why)", pytrace=False)
            self._reported_broken.add(name)
            pytest.fail(f"{name} could not be loaded from entry point {info.entry_point}:\n{info.load_error}", pytrace=False)
        return self.workers[name]

    def check_correctness(self, name: str, case: Case, *, backward: bool,
                          request: pytest.FixtureRequest | None = None) -> dict[str, Any]:
        """Run the correctness check in the implementation's worker; pass, skip or fail the test.
        With ``request``, the errors and the seed become the test's junit properties."""
        worker = self._usable_worker(name)
        message = {"op": "correctness", "case": case.to_dict(), "backward": backward,
                   "base_seed": self.settings.seed, "trials": self.settings.trials}
        try:
            report = worker.request(message, self.settings.timeout)
        except WorkerFailure as failure:
            pytest.fail(f"{name} on {case.id}: {failure}", pytrace=False)
        status = report["status"]
        if request is not None:
            for comparison in report.get("comparisons", []):
                request.node.user_properties.append((f"attnkit_{comparison['name']}_max_error", comparison["max_error"]))
                request.node.user_properties.append((f"attnkit_{comparison['name']}_allowed", comparison["allowed"]))
            if report.get("seed") is not None:
                request.node.user_properties.append(("attnkit_seed", report["seed"]))
        if status == "passed":
            return report
        if status == "unsupported":
            pytest.skip(f"{name} does not support it: {report['message']}")
        if status == "unavailable":
            pytest.skip(f"{name} is unavailable: {report['message']}")
        rerun = (f"seed {report.get('seed')} (trial {int(report.get('trial') or 0) + 1} of {report.get('trials')}); "
                 f"rerun with --attnkit-seed={self.settings.seed} -k '{name} and {case.id}'")
        if status == "error":
            pytest.fail(f"{name} raised on {case.id}, {rerun}:\n{report['message']}", pytrace=False)
        pytest.fail(f"{name} is wrong on {case.id}, {rerun}:\n{report['message']}", pytrace=False)

    def check_memory(self, name: str, *, backward: bool, request: pytest.FixtureRequest | None = None) -> None:
        """Sweep the sequence length in the implementation's worker, fit the exponent of its extra
        memory, and fail when it contradicts the declared class or the implementation's own model."""
        from pytest_attnkit.memory import MemoryPoint, fit_exponent, format_table, memory_problems

        direction = "forward+backward" if backward else "forward"
        if self.device != "cuda":
            pytest.skip(NO_MEMORY_METER_ON_CPU)
        worker = self._usable_worker(name)
        sweep = case_sets.memory_sweep(self.profile)
        points: list[MemoryPoint] = []
        for seqlen in sweep.seqlens:
            case = sweep.case(seqlen)
            message = {"op": "memory", "case": case.to_dict(), "backward": backward, "seed": self.settings.seed}
            try:
                reply = worker.request(message, self.settings.timeout)
            except WorkerFailure as failure:
                points.append(MemoryPoint(seqlen, "error", message=str(failure).splitlines()[0]))
                break
            if reply["status"] in ("unsupported", "unavailable"):
                pytest.skip(f"{name} does not support the memory sweep ({direction}) at {case.id}: {reply['message']}")
            if reply["status"] != "measured":
                pytest.fail(f"{name}: {reply['message']}", pytrace=False)
            points.append(MemoryPoint.from_dict(reply["point"]))
            if points[-1].status == "oom":
                break
        measured = [point for point in points if point.status == "measured"]
        slope = fit_exponent([p.seqlen for p in measured], [p.extra_bytes for p in measured])
        table = format_table(name, direction, points, slope)
        largest = max((p.seqlen for p in measured), default=None)
        table.append(f"  largest N that fit: {largest}" if points[-1].status == "measured"
                     else f"  largest N that fit: {largest} (the sweep stopped at N={points[-1].seqlen}: {points[-1].status})")
        self.memory_tables.append(table)
        self.memory_results.append({
            "impl": name, "direction": direction, "declared": self.impls[name].capabilities.get("memory_class"),
            "slope": slope, "largest_n": largest, "points": [point.to_dict() for point in points],
            "sweep": {"batch": sweep.batch, "heads": sweep.heads, "head_dim": sweep.head_dim, "dtype": sweep.dtype},
        })
        if request is not None:
            request.node.user_properties.append(("attnkit_memory_exponent", slope))
            request.node.user_properties.append(("attnkit_largest_n", largest))
        problems = memory_problems(self.impls[name].capabilities.get("memory_class"), points)
        if problems:
            pytest.fail(f"{name} memory ({direction}):\n" + "\n".join(problems) + "\n" + "\n".join(table), pytrace=False)

    def check_speed(self, name: str, case: Case, *, backward: bool, request: pytest.FixtureRequest) -> None:
        """Time the case in the implementation's worker and gate it against this GPU's baseline."""
        self.speed.check(name, "backward" if backward else "forward", case, request)

    def finish(self, exitstatus: int) -> list[str]:
        """End-of-run work (baselines, report files); returns lines for the terminal summary.

        An interrupted run (Ctrl-C, a CI timeout's SIGINT) saves no baseline, so the stored one
        stays whole, but still writes the report of what it gathered."""
        lines = []
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        if self.speed is not None and self.settings.save_baseline:
            if interrupted:
                lines.append(f"baseline NOT saved: the run was interrupted ({self.speed.path} is unchanged)")
            else:
                path = self.speed.save()
                if path is None:
                    lines.append("baseline not saved: no speed measurements in this run")
                else:
                    counts = self.speed.save_counts
                    lines.append(f"baseline saved: {path} ({counts['pooled']} entries pooled with their earlier runs, "
                                 f"{counts['restarted']} started afresh because this run found them changed, "
                                 f"{counts['new']} new)")
        if self.settings.report:
            from pytest_attnkit import report

            lines.extend(report.write(self, self.rootdir / self.settings.report, interrupted=interrupted))
        return lines

    def record(self, item: pytest.Item, report: pytest.TestReport) -> None:
        """Keep the outcome of an attnkit test for the headline table and the report files."""
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "attnkit_impl" not in params:
            return
        suite = next((name for name in ("correctness", "memory", "speed") if item.get_closest_marker(f"attnkit_{name}")), "?")
        case = params.get("attnkit_case")
        text = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else str(report.longrepr or "")
        self.outcomes.append({"test": item.nodeid, "impl": params["attnkit_impl"], "suite": suite,
                              "case": case.id if case is not None else None, "function": item.originalname,
                              "outcome": report.outcome, "message": text[:4000]})

    def memory_summary_lines(self) -> list[str]:
        lines = []
        for table in self.memory_tables:
            lines.extend(table)
        return lines

    # -- reporting --------------------------------------------------------------------------
    def header_lines(self) -> list[str]:
        env = self.environment
        device = env.get("device_name", "?")
        if self.device == "cuda":
            device = f"cuda: {device} (compute capability {env.get('compute_capability')}, CUDA {env.get('cuda_runtime')})"
        else:
            reason = "no CUDA device" if not env.get("cuda_available") else "chosen"
            device = f"cpu: {device} ({reason}; Triton kernels run in its interpreter)"
        versions = ", ".join(f"{lib} {env.get(lib) or 'not installed'}" for lib in ("torch", "triton", "cupy", "numpy"))
        lines = [
            f"attnkit: device {device}",
            f"attnkit: {versions}; python {env.get('python')}",
            f"attnkit: profile {self.profile}, suites {', '.join(self.settings.suite)}, seed {self.settings.seed}, "
            f"{'in-process' if self.settings.inprocess else 'one worker per implementation'}",
        ]
        if not self.impls:
            lines.append("attnkit: no implementations selected")
        for info in self.impls.values():
            origin = f"{info.entry_point}" + (f" from {info.distribution}" if info.distribution else "")
            if info.load_error:
                first_line = info.load_error.strip().splitlines()[-1] if info.load_error.strip() else "?"
                state = f"BROKEN: {first_line}"
            elif info.unavailable:
                state = f"unavailable: {info.unavailable}"
            else:
                caps = info.capabilities
                state = f"available ({caps.get('memory_class') or 'undeclared'} memory, {'fwd+bwd' if caps.get('backward') else 'fwd only'})"
            lines.append(f"attnkit:   {info.name:<16} {state}  [{origin}]")
        return lines
