"""The runner, with fake suites, a fake scheduler and a fake pool (no processes): a plan sent ahead
is sent once and its replies reach the suite's judge, with the inline scheduler each request is
sent when the suite reads its reply (a warm-up never), a cancelled or unsent request reads None, a
judgement raised as Judged is settled like one returned, plans go out in their suites' order, and
each collected test's SuiteItem is worked out from its marker, function and parameters."""

from __future__ import annotations

from typing import Any, Sequence

import pytest

from pytest_attnkit.contract import Case
from pytest_attnkit.controller.correctness import CorrectnessCheck
from pytest_attnkit.controller.impls import ImplInfo
from pytest_attnkit.controller.items import ITEM_KEY, suite_item
from pytest_attnkit.controller.memory import MemoryCheck, goes_on
from pytest_attnkit.controller.outcome import JUDGEMENT_KEY, Judged, Judgement, Outcomes, Verdict, failed
from pytest_attnkit.controller.runner import Runner
from pytest_attnkit.controller.scheduler import Job
from pytest_attnkit.controller.suite import Planned, Suite, SuiteItem, TestSpec
from pytest_attnkit.messages import Isolation, Op, Reply, Request, Status

CASE = Case(1, 2, 2, 17, 17, 32, "float16", causal=True)


def request(n: int, op: Op = Op.RUN) -> Request:
    return Request(op, CASE, options={"n": n}, suite="echo" if op is Op.RUN else None)


class FakeScheduler:
    """Keeps what is submitted; a job's reply is whatever the test sets on its future."""

    def __init__(self, budget_bytes: int | None = None) -> None:
        self.budget_bytes = budget_bytes
        self.jobs: list[Job] = []

    def submit(self, impl: str, suite: str, request: Request, *, gpu_bytes: int = 0, warm: bool = False,
               after: Job | None = None, follows: Any = None, same_worker: bool = False,
               isolation: Isolation = Isolation.SHARED, tag: str | None = None, launch: Any = None) -> Job:
        job = Job(impl, suite, request, gpu_bytes, len(self.jobs), warm=warm, after=after, follows=follows,
                  same_worker=same_worker, isolation=isolation, tag=tag, launch=launch)
        self.jobs.append(job)
        return job

    def wait(self, job: Job) -> Reply:
        return job.future.result(timeout=5)


class FakePool:
    """Answers a request sent on the test's thread (by the inline scheduler) with its ``n``; keeps
    what it was sent."""

    def __init__(self, capabilities: dict[str, Any] | None = None) -> None:
        self.sent: list[Request] = []
        self.capabilities = capabilities or {}

    def info(self, name: str) -> ImplInfo:
        return ImplInfo(name, f"fake:{name}", capabilities=self.capabilities)

    def primary(self, name: str) -> None:
        return None

    def request_alone(self, name: str, request: Request, *, worker: Any = None, suite: str | None = None) -> Reply:
        self.sent.append(request)
        return Reply(Status.OK, "", {"n": request.options["n"]})


class Echo(Suite):
    """A suite whose plan is given and whose judge keeps the replies it read; ``verdict`` decides."""

    name = "echo"
    tests = (TestSpec("test_echo", "correctness"),)

    def __init__(self, plan: list[Planned], verdict: Any = None, order: int = 0) -> None:
        self._plan, self._order = plan, order
        self.verdict = verdict or (lambda replies: Judgement(Verdict.PASSED, properties=(("attnkit_read", 1),)))
        self.read: list[Reply | None] = []

    def order(self, item: SuiteItem) -> int:
        return self._order

    def plan(self, item: SuiteItem) -> list[Planned]:
        return list(self._plan)

    def judge(self, item: SuiteItem, replies: Sequence[Reply | None], **fixtures: Any) -> Judgement:
        self.read = list(replies)
        return self.verdict(replies)


class Node:
    """What the runner and Outcomes.settle read of a pytest item."""

    def __init__(self, item: SuiteItem) -> None:
        self.nodeid = f"pytest_attnkit/suites/test_{item.suite}.py::{item.spec.function}[{item.impl}-{CASE.id}]"
        self.user_properties: list[tuple[str, object]] = []
        self.stash = pytest.Stash()
        self.stash[ITEM_KEY] = item


def item_of(suite: str = "echo", impl: str = "kernel", spec: TestSpec = Echo.tests[0]) -> SuiteItem:
    return SuiteItem(suite, spec, impl, CASE)


def test_a_request_sent_ahead_is_sent_once_and_its_reply_judged() -> None:
    suite, scheduler, pool = Echo([Planned(request(1), gpu_bytes=7)]), FakeScheduler(), FakePool()
    runner = Runner({"echo": suite}, pool, Outcomes(), scheduler)  # type: ignore[arg-type]
    item = item_of()
    runner.submit(item)
    runner.submit(item)  # collected twice, or submitted again: still one request
    assert len(scheduler.jobs) == 1 and scheduler.jobs[0].gpu_bytes == 7
    scheduler.jobs[0].future.set_result(Reply(Status.OK, "", {"n": "ahead"}))
    node = Node(item)
    runner.run(node)  # type: ignore[arg-type]
    assert [reply.data["n"] for reply in suite.read if reply] == ["ahead"]
    assert pool.sent == []  # not sent again on the test's thread
    assert node.stash[JUDGEMENT_KEY].verdict is Verdict.PASSED and node.user_properties == [("attnkit_read", 1)]
    assert runner.sent(item) == ()  # the test is done with it


def test_a_planned_request_keeps_the_worker_it_asks_for() -> None:
    plan = [Planned(request(1)), Planned(request(2), isolation=Isolation.DEDICATED, tag="torch_compile")]
    suite, scheduler = Echo(plan), FakeScheduler()
    Runner({"echo": suite}, FakePool(), Outcomes(), scheduler).submit(item_of())  # type: ignore[arg-type]
    assert [(job.isolation, job.tag, job.dedicated) for job in scheduler.jobs] == [
        (Isolation.SHARED, None, None), (Isolation.DEDICATED, "torch_compile", ("kernel", "torch_compile"))]


def test_with_the_inline_scheduler_a_request_is_sent_as_it_is_read_and_a_warm_up_never() -> None:
    suite, pool = Echo([Planned(request(0, Op.WARM), warm=True), Planned(request(1)), Planned(request(2))],
                       verdict=lambda replies: Judgement(Verdict.PASSED) if replies[1] else failed("?")), FakePool()
    runner = Runner({"echo": suite}, pool, Outcomes())  # type: ignore[arg-type]
    item = item_of()
    runner.submit(item)  # the inline scheduler runs nothing until the test reads a reply
    assert pool.sent == []
    runner.run(Node(item))  # type: ignore[arg-type]
    assert [reply.data["n"] if reply else None for reply in suite.read] == [None, 1, 2]
    assert [sent.options["n"] for sent in pool.sent] == [1, 2]



class First(Echo):
    """Reads the first reply only, as a memory sweep that ended after its first point."""

    def judge(self, item: SuiteItem, replies: Sequence[Reply | None], **fixtures: Any) -> Judgement:
        self.read = [replies[0]]
        return Judgement(Verdict.PASSED)


def test_a_request_whose_reply_is_not_read_is_not_sent() -> None:
    pool = FakePool()
    Runner({"echo": First([Planned(request(1)), Planned(request(2))])}, pool, Outcomes()).run(
        Node(item_of()))  # type: ignore[arg-type]
    assert [sent.options["n"] for sent in pool.sent] == [1]


def test_a_judgement_raised_as_judged_is_settled() -> None:
    def deep(replies: Sequence[Reply | None]) -> Judgement:
        raise Judged(failed("kernel is wrong on b1-h2-q17-k17-d32-fp16-causal"))

    suite = Echo([Planned(request(1))], verdict=deep)
    node = Node(item_of())
    with pytest.raises(pytest.fail.Exception, match="kernel is wrong on b1-h2-q17"):
        Runner({"echo": suite}, FakePool(), Outcomes()).run(node)  # type: ignore[arg-type]
    assert node.stash[JUDGEMENT_KEY].verdict is Verdict.FAILED


def test_a_cancelled_request_and_a_warm_up_over_the_budget_reach_judge_as_none() -> None:
    suite = Echo([Planned(request(1)), Planned(request(2, Op.WARM), gpu_bytes=11, warm=True)],
                 verdict=lambda replies: Judgement(Verdict.PASSED))
    scheduler = FakeScheduler(budget_bytes=10)
    runner = Runner({"echo": suite}, FakePool(), Outcomes(), scheduler)  # type: ignore[arg-type]
    item = item_of()
    runner.submit(item)
    assert len(scheduler.jobs) == 1  # the warm-up alone is over the budget: left out
    scheduler.jobs[0].future.cancel()  # the run is stopping (-x, Ctrl-C)
    runner.run(Node(item))  # type: ignore[arg-type]
    assert suite.read == [None, None]


def test_a_test_of_a_suite_not_selected_skips_saying_so() -> None:
    node = Node(item_of(suite="speed"))
    with pytest.raises(pytest.skip.Exception, match=r"the speed suite is not selected \(--attnkit-suite\)"):
        Runner({}, FakePool(), Outcomes()).run(node)  # type: ignore[arg-type]


def test_memory_sweeps_are_submitted_ahead_of_the_other_tests_and_chained() -> None:
    """A sweep is a chain of points: submitted after every correctness case, its first point would
    wait for them and the chain would run alone at the end of the concurrent phase."""
    pool, scheduler = FakePool({"memory_class": "linear"}), FakeScheduler()
    suites: dict[str, Suite] = {
        "correctness": CorrectnessCheck(pool, Outcomes(), 0, 2),  # type: ignore[arg-type]
        "memory": MemoryCheck(pool, Outcomes(), "cuda", 0, profile="smoke", meter="process")}  # type: ignore[arg-type]
    forward, backward = CorrectnessCheck.tests
    items = [item_of("correctness", spec=forward), SuiteItem("memory", MemoryCheck.tests[0], "kernel", None),
             item_of("correctness", spec=backward)]
    Runner(suites, pool, Outcomes(), scheduler).submit_all(items)  # type: ignore[arg-type]
    assert all(job.request.op is Op.RUN for job in scheduler.jobs)
    ops = [job.request.suite for job in scheduler.jobs]
    points = ops.count("memory")
    assert points >= 3 and ops == ["memory"] * points + ["correctness"] * 2
    chain = scheduler.jobs[:points]
    assert chain[0].after is None and all(job.after is chain[i] and job.same_worker and job.follows is goes_on
                                        for i, job in enumerate(chain[1:]))
    assert [job.request.backward for job in scheduler.jobs[points:]] == [False, True]
    # With a meter that sees the whole device, the sweep's points are only warmed up ahead, last.
    device_wide = MemoryCheck(pool, Outcomes(), "cuda", 0, profile="smoke", meter="device")  # type: ignore[arg-type]
    assert device_wide.order(items[1]) > suites["correctness"].order(items[0])
    assert all(planned.warm and planned.request.op is Op.WARM for planned in device_wide.plan(items[1]))


class Marked:
    """A collected test as items.suite_item reads it: its marker, function and parameters."""

    def __init__(self, marker: str, function: str, params: dict[str, Any]) -> None:
        self.marker, self.originalname, self.name = marker, function, f"{function}[...]"
        self.callspec = type("CallSpec", (), {"params": params})()

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == self.marker else None


def test_a_collected_test_becomes_its_suite_item_once() -> None:
    suites = {"correctness": CorrectnessCheck, "memory": MemoryCheck}
    memory = suite_item(Marked("attnkit_memory", "test_memory_window_backward", {"attnkit_impl": "kernel"}),
                        suites)  # type: ignore[arg-type]
    assert memory is not None and (memory.impl, memory.case, memory.backward) == ("kernel", None, True)
    assert memory.spec.params == {"sweep": "window"}
    forward = suite_item(Marked("attnkit_correctness", "test_forward", {"attnkit_impl": "kernel",
                                                                        "attnkit_case": CASE}), suites)  # type: ignore[arg-type]
    assert forward == SuiteItem("correctness", CorrectnessCheck.tests[0], "kernel", CASE)
    assert hash(forward) == hash(SuiteItem("correctness", CorrectnessCheck.tests[0], "kernel", CASE))
    # A project's own test that uses the attnkit fixture, and a function its suite does not name: none.
    assert suite_item(Marked("attnkit_correctness", "test_mine", {"attnkit_impl": "kernel"}), suites) is None  # type: ignore[arg-type]
    assert suite_item(Marked("", "test_forward", {}), suites) is None  # type: ignore[arg-type]


def test_requests_of_the_case_accepted_at_collection_are_sent_checked_and_no_others() -> None:
    """The implementation was asked at collection about the item's (case, backward): its worker is
    not asked again for those requests; a memory sweep's later points are other cases, and an item
    nobody asked about (or whose support query failed) is asked in the worker as before."""
    other = Case(1, 2, 2, 33, 33, 32, "float16", causal=True)
    backward = Request(Op.RUN, CASE, True, options={"n": 2}, suite="echo")
    plan = [Planned(request(0, Op.WARM), warm=True), Planned(request(1)), Planned(backward),
            Planned(Request(Op.RUN, other, options={"n": 3}, suite="echo"))]
    scheduler = FakeScheduler()
    runner = Runner({"echo": Echo(plan)}, FakePool(), Outcomes(), scheduler)  # type: ignore[arg-type]
    accepted, unasked = item_of(), item_of(impl="other")
    runner.accept(accepted, CASE, False)
    runner.submit(accepted)
    runner.submit(unasked)
    assert [job.request.checked for job in scheduler.jobs] == [True, True, False, False] + [False] * 4
    # Sent on the test's own thread (no scheduler), the same.
    suite, pool = Echo(plan[1:]), FakePool()
    inline = Runner({"echo": suite}, pool, Outcomes())  # type: ignore[arg-type]
    inline.accept(accepted, CASE, False)
    inline.run(Node(accepted))  # type: ignore[arg-type]
    assert [sent.checked for sent in pool.sent] == [True, False, False]


def test_the_runner_marks_an_item_accepted_only_where_the_implementation_said_so() -> None:
    """Runner.mark_refusals: a refused item is skipped and not accepted, a supported one accepted."""
    class Pool(FakePool):
        def support(self, name: str, queries: list[dict[str, Any]]) -> list[str | None]:
            return [None if query["case"]["seqlen_q"] == CASE.seqlen_q else "too long" for query in queries]

    class Collected:
        def __init__(self, case: Case) -> None:
            self.nodeid, self.name, self.originalname = f"x[kernel-{case.id}]", "test_forward", "test_forward"
            self.callspec = type("Callspec", (), {"params": {"attnkit_impl": "kernel", "attnkit_case": case}})()
            self.stash = pytest.Stash()
            self.markers: list[Any] = []

        def get_closest_marker(self, name: str) -> Any:
            return object() if name == "attnkit_correctness" else None

        def add_marker(self, marker: Any) -> None:
            self.markers.append(marker)

    pool, outcomes = Pool(), Outcomes()
    suites = {"correctness": CorrectnessCheck(pool, outcomes, 0, 1)}  # type: ignore[arg-type]
    runner = Runner(suites, pool, outcomes, FakeScheduler())  # type: ignore[arg-type]
    long = Case(1, 2, 2, 4097, 4097, 32, "float16", causal=True)
    nodes = [Collected(CASE), Collected(long)]
    runner.mark_refusals(nodes, {"correctness": CorrectnessCheck})  # type: ignore[arg-type]
    assert [bool(node.markers) for node in nodes] == [False, True]
    assert set(runner._accepted) == {nodes[0].stash[ITEM_KEY]}


def test_a_case_the_worker_refuses_at_run_time_keeps_its_refusal_mark() -> None:
    """Where the collection's support query could not tell, the worker refuses the case when it
    runs: the test is skipped and marked refused all the same (session.asked_for_but_untested)."""
    check = CorrectnessCheck(FakePool(), Outcomes(), 0, 1)  # type: ignore[arg-type]
    judgement = check.judge(item_of("correctness"), [Reply(Status.UNSUPPORTED, "head_dim=64 (supported: 96)")])
    assert judgement.verdict is Verdict.SKIPPED and judgement.record == {"refused": True}, judgement
