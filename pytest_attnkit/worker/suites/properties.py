"""The properties suite's worker handler: one property check (``options["check"]``) of one case
(:mod:`pytest_attnkit.worker.properties`)."""

from __future__ import annotations

from pytest_attnkit.messages import Reply, Request
from pytest_attnkit.worker.suite import SuiteHandler, WorkerContext


class PropertiesHandler(SuiteHandler):
    def handle(self, context: WorkerContext, request: Request) -> Reply:
        from pytest_attnkit.worker import properties

        impl, case, device, seed, backward = context.impl, request.case, context.device, request.seed, request.backward
        assert case is not None
        check = request.options["check"]
        if check == "determinism":
            directions = impl.deterministic_directions()
            declared = ("backward" if backward else "forward") in directions
            # A backward run's output and LSE are held only where the forward is declared too.
            return properties.check_determinism(impl, case, device=device, seed=seed, backward=backward,
                                                declared=declared, hold_forward="forward" in directions)
        if check == "batch_invariance":
            return properties.check_batch_invariance(impl, case, device=device, seed=seed,
                                                     declared=bool(impl.batch_invariant))
        if check == "cuda_graph":
            return properties.check_cuda_graph(impl, case, seed=seed, declared=bool(impl.supports_cuda_graphs),
                                               accuracy=request.option("accuracy"))
        if check == "torch_compile":
            return properties.check_torch_compile(impl, case, device=device, seed=seed,
                                                  declared=bool(impl.supports_torch_compile),
                                                  accuracy=request.option("accuracy"))
        if check == "opcheck":
            return properties.check_opcheck(impl, case, device=device, seed=seed, op_name=str(impl.custom_op))
        raise ValueError(f"unknown property check {check!r}")
