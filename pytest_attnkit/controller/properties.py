"""The properties suite's check: behaviour the oracle cannot see, held to what is declared.

Each test asks the implementation's worker to run one property check on one case
(:mod:`pytest_attnkit.worker.properties`): determinism (forward, and backward), batch invariance,
capture and replay in a CUDA graph, ``torch.compile(fullgraph=True)``, and
``torch.library.opcheck`` for an implementation that names its custom op. A property the
implementation declares (``deterministic``, ``batch_invariant``, ``supports_cuda_graphs``,
``supports_torch_compile``, ``custom_op``) fails the test when it does not hold; one it does not
declare is checked all the same and reported (the summary's ``properties`` line, the report's
``properties`` section), without failing: an author sees what to declare, or what to fix.

Like correctness cases, property checks run ahead of their tests, beside each other, when a
:mod:`~pytest_attnkit.controller.scheduler` runs (:meth:`PropertyCheck.submit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


from pytest_attnkit.contract import Case
from pytest_attnkit.controller.outcome import Judged, Outcomes, failed, skipped
from pytest_attnkit.controller.pool import WorkerPool
from pytest_attnkit.controller.scheduler import Job, Scheduler
from pytest_attnkit.messages import Op, Reply, Request, Status

#: The checks, in the order the summary shows them.
TITLES = {"determinism": "deterministic", "batch_invariance": "batch-invariant", "cuda_graph": "CUDA graphs",
          "torch_compile": "torch.compile", "opcheck": "opcheck"}
#: How the failure names what the implementation declared.
DECLARATIONS = {"determinism": "deterministic", "batch_invariance": "batch_invariant = True",
                "cuda_graph": "supports_cuda_graphs = True", "torch_compile": "supports_torch_compile = True",
                "opcheck": "custom_op"}

#: (check, implementation, case id, backward): one test's question.
Key = tuple[str, str, str, bool]


@dataclass
class PropertyCheck:
    pool: WorkerPool
    outcomes: Outcomes
    seed: int
    device: str
    #: Every check's result, for the report and the summary.
    results: list[dict[str, Any]] = field(default_factory=list)
    ahead: dict[Key, list[Job]] = field(default_factory=dict)

    def skip_reason(self, check: str, impl: str, case: Case) -> str | None:
        """Why this check does not apply to this implementation and case, or None."""
        capabilities = self.pool.info(impl).capabilities
        if check == "cuda_graph" and self.device != "cuda":
            return "CUDA graphs need a CUDA device; this run is on the CPU"
        if check == "opcheck" and not capabilities.get("custom_op"):
            return f"{impl} names no custom op (custom_op), so there is nothing for torch.library.opcheck"
        if check == "batch_invariance" and case.batch < 2:
            return "a batch of one sequence has no other composition"
        return None

    def _message(self, check: str, case: Case, backward: bool) -> Request:
        return Request(Op.PROPERTY, case, backward, self.seed, {"check": check})

    def submit(self, scheduler: Scheduler, check: str, impl: str, case: Case, *, backward: bool,
               gpu_bytes: int) -> None:
        if self.skip_reason(check, impl, case) is None:
            job = scheduler.submit(impl, "properties", self._message(check, case, backward), gpu_bytes=gpu_bytes)
            self.ahead.setdefault((check, impl, case.id, backward), []).append(job)

    def _reply(self, check: str, impl: str, case: Case, backward: bool) -> Reply:
        submitted = self.ahead.get((check, impl, case.id, backward))
        if submitted and self.pool.scheduler is not None:
            return self.pool.scheduler.wait(submitted.pop(0))
        return self.pool.request(impl, self._message(check, case, backward))

    def check(self, check: str, impl: str, case: Case, *, backward: bool = False,
              properties: list[tuple[str, object]] | None = None) -> dict[str, Any] | None:
        """Run one check; fails the test when a declared property does not hold."""
        reason = self.skip_reason(check, impl, case)
        if reason:
            raise Judged(skipped(reason))
        reply = self._reply(check, impl, case, backward)
        where = f"{case.id}{' (backward)' if backward else ''}"
        found = reply.data if reply.data.get("check") == check else None
        if found is not None:
            self.results.append({"impl": impl, "check": check, "case": case.id, "backward": backward,
                                 "declared": found["declared"], "holds": found["holds"], "detail": found["detail"],
                                 "figures": found.get("figures", {})})
            if properties is not None:
                properties.append((f"attnkit_{check}", "holds" if found["holds"] else "does not hold"))
                properties.append((f"attnkit_{check}_declared", found["declared"]))
        if found is not None and reply.status is Status.WRONG:
            raise Judged(failed(f"{impl} declares {DECLARATIONS[check]}, and on {where}: {found['detail']}"))
        self.outcomes.check(reply, impl=impl, where=f"{where} ({TITLES[check]} check)",
                             origin=self.pool.info(impl).origin)
        return found
