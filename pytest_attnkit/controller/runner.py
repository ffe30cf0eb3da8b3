"""The runner: the body of every suite test, and the one map of the requests sent ahead of them.

At collection :meth:`Runner.mark_refusals` skips what a suite or an implementation refuses, asking
each implementation once. Once pytest has selected the tests, the session hands each one's :class:`SuiteItem` to
:meth:`Runner.submit`, which asks its suite for the plan (:meth:`Suite.plan`) and submits each
planned request to the scheduler (:mod:`pytest_attnkit.controller.scheduler`), keyed by the item.
When the test runs, :meth:`Runner.run` hands the suite the replies to its plan
(:class:`Replies`: each one waited for when the suite reads it) and settles the suite's judgement
through :meth:`Outcomes.settle`, the one place a verdict is made. With ``--attnkit-jobs=1`` and
``--attnkit-inprocess`` the scheduler is the :class:`~pytest_attnkit.controller.inline.InlineScheduler`:
each planned request runs on the test's own thread when the suite reads its reply, and a warm-up
not at all (the test's own request compiles what it needs). A test whose plan was not sent ahead
submits it as it runs, without its warm-ups.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import CancelledError
from dataclasses import replace
from typing import TYPE_CHECKING, Any, overload

import pytest

from pytest_attnkit.contract import Case
from pytest_attnkit.controller.inline import InlineScheduler
from pytest_attnkit.controller.items import ITEM_KEY, mark_items
from pytest_attnkit.controller.outcome import Judged, Outcomes, last_line, refused, skipped
from pytest_attnkit.controller.scheduler import Job, Scheduler
from pytest_attnkit.controller.suite import Planned, Suite, SuiteItem
from pytest_attnkit.messages import Reply

if TYPE_CHECKING:
    from pytest_attnkit.controller.pool import WorkerPool


class Replies(Sequence["Reply | None"]):
    """The replies to one item's plan, in its order; each is fetched when first read, so a suite
    that stops reading (a memory sweep that ended) waits for, or sends, nothing more."""

    def __init__(self, plan: list[Planned], jobs: list[Job | None], scheduler: "Scheduler | InlineScheduler") -> None:
        self._plan, self._jobs, self._scheduler = plan, jobs, scheduler
        self._read: dict[int, Reply | None] = {}

    def __len__(self) -> int:
        return len(self._plan)

    @overload
    def __getitem__(self, index: int) -> Reply | None: ...

    @overload
    def __getitem__(self, index: slice) -> list[Reply | None]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        index %= len(self)
        if index not in self._read:
            self._read[index] = self._fetch(index)
        return self._read[index]

    def _fetch(self, index: int) -> Reply | None:
        job = self._jobs[index]
        if job is None or job.future.cancelled():
            return None
        try:
            return self._scheduler.wait(job)
        except CancelledError:  # the run is stopping, or a chain stopped: nobody ran it
            return None


class Runner:
    """Sends each item's plan ahead of it and settles each test from its replies."""

    def __init__(self, suites: Mapping[str, Suite], pool: "WorkerPool", outcomes: Outcomes,
                 scheduler: "Scheduler | InlineScheduler | None" = None) -> None:
        self.suites = suites
        self.pool = pool
        self.outcomes = outcomes
        self.scheduler = scheduler if scheduler is not None else InlineScheduler(pool)
        #: Per item: its plan and the scheduler's job of each planned request (None: not sent).
        self._ahead: dict[SuiteItem, tuple[list[Planned], list[Job | None]]] = {}
        #: Per item the implementation accepted at collection: the (case, backward) it was asked.
        self._accepted: dict[SuiteItem, tuple[Case, bool]] = {}

    def accept(self, item: SuiteItem, case: Case, backward: bool) -> None:
        """The implementation said at collection that it supports ``case`` (``backward``) for
        ``item`` (:meth:`Suite.support_query`): the item's planned requests of that case and
        direction are sent ``checked``, and the worker does not ask again."""
        self._accepted[item] = (case, backward)

    def mark_refusals(self, items: list[pytest.Item], suite_types: Mapping[str, type[Suite]]) -> None:
        """Work out each suite test's SuiteItem, then mark the items skipped that their suite
        refuses (:meth:`Suite.refusal`) or the implementation does (unavailable, or an unsupported
        case: :meth:`Suite.support_query`), with the reasons in words. One question per
        implementation, at collection.

        The reason leaves the case out (the test id has it), so pytest's summary groups the
        skips that share a reason."""
        questions: dict[str, list[tuple[pytest.Item, Case, bool]]] = {}
        for node, item in mark_items(items, suite_types):
            suite = self.suites.get(item.suite)
            if suite is None:
                continue  # a suite not selected: its tests say so when they run
            refusal = suite.refusal(item)
            if refusal is not None:
                self.outcomes.skip_at_collection(node, refusal)
                continue
            query = suite.support_query(item)
            if query is not None:
                questions.setdefault(item.impl, []).append((node, *query))
        for name, asked in questions.items():
            info = self.pool.info(name)
            if info.load_error:
                # One import error, one failure: the first test fails with it, the rest point there.
                first = asked[0][0]
                reason = (f"{name} could not be loaded ({last_line(info.load_error)}); "
                          f"{first.nodeid} fails with the traceback")
                for item, _, _ in asked[1:]:
                    self.outcomes.skip_at_collection(item, skipped(reason))
                continue
            if info.unavailable:
                for item, _, _ in asked:
                    self.outcomes.skip_at_collection(item, skipped(f"{name} is unavailable: {info.unavailable}"))
                continue
            refusals = self.pool.support(name, [{"case": case.to_dict(), "backward": backward} for _, case, backward in asked])
            for (item, case, backward), refusal in zip(asked, refusals or []):
                if refusal:
                    self.outcomes.skip_at_collection(item, refused(name, refusal))
                else:
                    self.accept(item.stash[ITEM_KEY], case, backward)  # its worker need not ask again

    def _plan(self, suite: Suite, item: SuiteItem) -> list[Planned]:
        """The suite's plan for ``item``, each request of the case and direction accepted at
        collection marked ``checked`` (a memory sweep's later points are other cases: asked)."""
        plan = suite.plan(item)
        query = self._accepted.get(item)
        if query is None:
            return plan
        return [replace(planned, request=replace(planned.request, checked=True))
                if (planned.request.case, planned.request.backward) == query else planned for planned in plan]

    def submit(self, item: SuiteItem, *, warm_ups: bool = True) -> None:
        """Submit the item's plan to the scheduler now (nothing for an item already submitted). A
        warm-up estimated to need more than the scheduler's whole budget is left out: it would run
        alone, ahead of tests that wait; so is every warm-up without ``warm_ups`` (the test runs
        now). A plan that cannot be made now (a hook's bad answer) is made again when the test
        runs, which fails with the error."""
        suite = self.suites.get(item.suite)
        if suite is None or item in self._ahead:
            return
        try:
            plan = self._plan(suite, item)
        except pytest.UsageError:
            return
        self._send(item, plan, warm_ups=warm_ups)

    def _send(self, item: SuiteItem, plan: list[Planned], *, warm_ups: bool) -> list[Job | None]:
        budget = self.scheduler.budget_bytes
        jobs: list[Job | None] = []
        for planned in plan:
            if planned.warm and (not warm_ups or (budget is not None and planned.gpu_bytes > budget)):
                jobs.append(None)
                continue
            jobs.append(self.scheduler.submit(item.impl, item.suite, planned.request, gpu_bytes=planned.gpu_bytes,
                                              warm=planned.warm, follows=planned.follows,
                                              same_worker=planned.same_worker,
                                              isolation=planned.isolation, tag=planned.tag, launch=planned.launch,
                                              after=jobs[planned.after] if planned.after is not None else None))
        self._ahead[item] = (plan, jobs)
        return jobs

    def submit_all(self, items: Iterable[SuiteItem]) -> None:
        """Submit the items' plans in their suites' order (:meth:`Suite.order`), pytest's among equals."""
        known = [item for item in items if item.suite in self.suites]
        for item in sorted(known, key=lambda item: self.suites[item.suite].order(item)):
            self.submit(item)

    def sent(self, item: SuiteItem) -> Sequence[Job | None]:
        """The jobs submitted for ``item``'s plan that its test has not finished with (empty
        otherwise), for a suite that needs another item's warm-up (speed times a case in the
        worker that warmed it up)."""
        return self._ahead.get(item, ((), ()))[1]

    def replies(self, item: SuiteItem) -> Replies:
        """The replies to the item's plan; a plan not sent ahead is submitted now, without its
        warm-ups (a plan's error fails the test)."""
        if item in self._ahead:
            plan, jobs = self._ahead[item]
        else:
            plan = self._plan(self.suites[item.suite], item)
            jobs = self._send(item, plan, warm_ups=False)
        return Replies(plan, jobs, self.scheduler)

    def run(self, node: pytest.Item, **fixtures: Any) -> None:
        """The body of every suite test: the replies to the item's plan, judged by its suite,
        settled. ``fixtures`` go to :meth:`Suite.judge`."""
        item = node.stash.get(ITEM_KEY, None)
        if item is None:
            raise LookupError(f"{node.nodeid} is no test of an attnkit suite (no attnkit_<suite> marker "
                              "or a function its suite does not name)")
        suite = self.suites.get(item.suite)
        if suite is None:
            self.outcomes.settle(node, skipped(f"the {item.suite} suite is not selected (--attnkit-suite)"))
            return
        try:
            judgement = suite.judge(item, self.replies(item), **fixtures)
        except Judged as judged:
            judgement = judged.judgement
        finally:
            self._ahead.pop(item, None)
        self.outcomes.settle(node, judgement)
