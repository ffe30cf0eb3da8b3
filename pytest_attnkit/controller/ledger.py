"""The ledger: where a run's time went, per suite and implementation.

Every reply a worker sends says how long its request took in the worker and how much of that was
compiling (:mod:`pytest_attnkit.worker.compile_clock`); the scheduler adds when each request
started and ended and how long it waited in the queue; the pool adds the workers' start-up time;
the session adds how long the pytest thread waited for results. From these the summary's "attnkit
time" table and the report's ``time`` section say, per suite and implementation, how many
requests ran, the seconds workers were busy with them (of which compiling) and the wall-clock
span from the first to the last; and for the run, the most requests that ran at once.

The run's timeline (:func:`timeline`) says when the first request started (and, from the
session's :meth:`Ledger.mark`, what came before it: the device probed, the implementations'
first workers started, the tests collected), until when requests
ran beside one another, and how long the requests that had the GPU to themselves took (the speed
suite's timing, above all): on a GPU that phase is often half the run, and no number of jobs
shortens it.

Busy seconds add up across workers running at the same time, so they can exceed the run's wall
time; that is the point of running them together. "warm" requests compile the memory and speed
suites' kernels ahead of them (:mod:`pytest_attnkit.controller.scheduler`) and are counted in rows
of their own ("memory (warm)", "speed (warm)"). The sanitize suite's runs under compute-sanitizer
are "warm" requests to the worker too, but counted as "sanitize": they are its tests, not warm-ups.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from pytest_attnkit.messages import Reply, Request, Spent


@dataclass
class Account:
    """One (suite, implementation)'s requests."""

    requests: int = 0
    busy_s: float = 0.0
    compile_s: float = 0.0
    queued_s: float = 0.0
    first_start: float | None = None
    last_end: float | None = None

    def add(self, spent: Spent, started: float, ended: float, queued_s: float) -> None:
        self.requests += 1
        self.busy_s += float(ended - started if spent.wall_s is None else spent.wall_s)
        self.compile_s += float(spent.compile_s)
        self.queued_s += queued_s
        self.first_start = started if self.first_start is None else min(self.first_start, started)
        self.last_end = ended if self.last_end is None else max(self.last_end, ended)

    @property
    def span_s(self) -> float:
        if self.first_start is None or self.last_end is None:
            return 0.0
        return self.last_end - self.first_start


class Ledger:
    """Thread-safe: the scheduler's threads and the pytest thread record into it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.monotonic()
        self.accounts: dict[tuple[str, str], Account] = {}
        self.startup_s: dict[str, float] = {}
        self.waited_s = 0.0
        self._running = 0
        self.most_at_once = 0
        #: Every request: (suite, implementation, start and wall seconds, compile seconds, queued
        #: seconds, whether it had the GPU alone), the start counted from the ledger's; the report
        #: keeps them for a timeline (:func:`timeline`).
        self.events: list[tuple[str, str, float, float, float, float, bool]] = []
        #: Per implementation: requests run again alone after an out-of-memory beside others.
        self.retried_alone: dict[str, int] = {}
        #: Per implementation: rounds of room made for a request that ran out of memory alone (idle
        #: workers stopped by the failure's figures, then every other one); and how many workers
        #: were stopped for them in all.
        self.retried_cleared: dict[str, int] = {}
        self.stopped_workers = 0
        #: Every out-of-memory that sent a request to run again: which request, where it ran
        #: (beside others or alone) and the failure's figures (:func:`out_of_memory_entry`).
        self.out_of_memory: list[dict[str, Any]] = []
        #: The moments before the first request, in seconds from the ledger's start (:meth:`mark`).
        self.marks: dict[str, float] = {}

    def mark(self, moment: str) -> None:
        """``moment`` (one of :data:`MARKS`) happened now; the first time counts."""
        with self._lock:
            self.marks.setdefault(moment, round(time.monotonic() - self.started, 2))

    def began(self) -> None:
        """A request started (for the most that ran at once)."""
        with self._lock:
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)

    def record(self, suite: str, impl: str, spent: Spent, started: float, ended: float, *,
               queued_s: float = 0.0, counted: bool = True, alone: bool = False) -> None:
        """A request ended; ``counted`` False when :meth:`began` was not called for it; ``alone``
        where it had the GPU to itself."""
        with self._lock:
            if counted:
                self._running = max(0, self._running - 1)
            self.accounts.setdefault((suite, impl), Account()).add(spent, started, ended, queued_s)
            self.events.append((suite, impl, round(started - self.started, 3), round(ended - started, 3),
                                round(float(spent.compile_s), 3), round(queued_s, 3), alone))

    def ran_out_of_memory(self, impl: str) -> None:
        """A request of ``impl`` ran out of device memory beside others and goes again, alone."""
        with self._lock:
            self.retried_alone[impl] = self.retried_alone.get(impl, 0) + 1

    def ran_out(self, row: str, impl: str, request: Request, reply: Reply, *, beside: bool) -> None:
        """A request of ``impl`` (counted in the time table's ``row``) ran out of device memory
        (``beside`` others, or alone) and goes again."""
        with self._lock:
            self.out_of_memory.append(out_of_memory_entry(row, impl, request, reply, beside=beside))

    def cleared_gpu(self, impl: str, stopped: int) -> None:
        """A request of ``impl`` that ran out of memory alone goes again, ``stopped`` other workers
        stopped first."""
        with self._lock:
            self.retried_cleared[impl] = self.retried_cleared.get(impl, 0) + 1
            self.stopped_workers += stopped

    def waited(self, seconds: float) -> None:
        """The pytest thread waited this long for a result it needed."""
        with self._lock:
            self.waited_s += seconds

    def started_worker(self, impl: str, seconds: float) -> None:
        with self._lock:
            self.startup_s[impl] = self.startup_s.get(impl, 0.0) + seconds

    def to_dict(self, more_startup_s: dict[str, float] | None = None) -> dict[str, Any]:
        """The report document's ``time`` section; ``more_startup_s``: start-up seconds of workers
        still running (the primaries), beside those of the workers already closed."""
        with self._lock:
            startup = dict(self.startup_s)
            for impl, seconds in (more_startup_s or {}).items():
                startup[impl] = startup.get(impl, 0.0) + seconds
            rows = [{"suite": suite, "impl": impl, "requests": account.requests, "busy_s": round(account.busy_s, 2),
                     "compile_s": round(account.compile_s, 2), "queued_s": round(account.queued_s, 2),
                     "span_s": round(account.span_s, 2)}
                    for (suite, impl), account in sorted(self.accounts.items())]
            return {"wall_s": round(time.monotonic() - self.started, 2), "rows": rows,
                    "startup_s": {impl: round(seconds, 2) for impl, seconds in sorted(startup.items())},
                    "waited_s": round(self.waited_s, 2), "most_at_once": self.most_at_once,
                    "retried_alone": dict(sorted(self.retried_alone.items())),
                    "retried_cleared": dict(sorted(self.retried_cleared.items())),
                    "stopped_workers": self.stopped_workers,
                    "out_of_memory": list(self.out_of_memory), "marks": dict(self.marks),
                    "events": [dict(zip(("suite", "impl", "start_s", "wall_s", "compile_s", "queued_s", "alone"),
                                        event)) for event in self.events]}


def timeline(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """From a report's ``time.events``: when the first request started (``first_s``), when the
    last of those run beside one another ended (``together_until_s``; None if none was), and of
    those that had the GPU alone, how many ran (``alone_requests``), from when to when
    (``alone_from_s``, ``alone_until_s``) and their seconds added up (``alone_s``: what no number
    of jobs shortens). None without events. Events of a report written before the ``alone`` field
    count as run beside one another."""
    if not events:
        return None
    together = [event for event in events if not event.get("alone")]
    alone = [event for event in events if event.get("alone")]

    def end(event: dict[str, Any]) -> float:
        return float(event["start_s"]) + float(event["wall_s"])

    return {"first_s": min(float(event["start_s"]) for event in events),
            "together_until_s": max(map(end, together)) if together else None,
            "alone_requests": len(alone),
            "alone_from_s": min(float(event["start_s"]) for event in alone) if alone else None,
            "alone_until_s": max(map(end, alone)) if alone else None,
            "alone_s": sum(float(event["wall_s"]) for event in alone)}


#: The session's moments before the first request (:meth:`Ledger.mark`), in the words the
#: timeline uses (which says them in the order they happened: the implementations' first workers
#: start beside the probe, and may be ready first).
MARKS = {"probed": "the device probed", "started": "the implementations' first workers ready",
         "collected": "the tests collected"}


def timeline_line(events: list[dict[str, Any]], marks: dict[str, float] | None = None) -> str | None:
    """:func:`timeline` in words, for the time table; None without events. ``marks``: the report's
    ``time.marks`` (what happened before the first request, and when)."""
    phases = timeline(events)
    if phases is None:
        return None
    marks = {moment: marks[moment] for moment in MARKS if moment in (marks or {})}
    before = [f"{MARKS[moment]} at {seconds:.0f} s" for moment, seconds in sorted(marks.items(), key=lambda m: m[1])]
    parts = [f"the first request started at {phases['first_s']:.0f} s" + (f" ({', '.join(before)})" if before else "")]
    if phases["together_until_s"] is not None:
        parts.append(f"requests ran beside one another until {phases['together_until_s']:.0f} s")
    if phases["alone_requests"]:
        parts.append(f"{phases['alone_requests']} requests run alone took {phases['alone_s']:.0f} s, from "
                     f"{phases['alone_from_s']:.0f} to {phases['alone_until_s']:.0f} s")
    return "timeline: " + "; ".join(parts)


def out_of_memory_entry(row: str, impl: str, request: Request, reply: Reply, *, beside: bool) -> dict[str, Any]:
    """One out-of-memory for the report: the request (its time-table row, case, direction), where it ran, and
    what the worker measured (:mod:`pytest_attnkit.worker.out_of_memory`): the allocation asked
    for, the free bytes at the failure, what the failing process held once its request let go,
    and what the other processes on the GPU held (in all, and the most one held)."""
    figures = reply.data.get("out_of_memory") or {}
    case = request.case
    held = [int(used) for used in (figures.get("processes") or {}).values()]
    return {"impl": impl, "suite": row, "case": case.id if case is not None else "",
            "mode": "backward" if request.backward else "forward", "beside": beside,
            **{key: figures[key] for key in ("requested_bytes", "free_at_failure_bytes", "free_bytes",
                                             "total_bytes", "process_bytes", "other_processes", "other_bytes")
               if figures.get(key) is not None},
            **({"largest_other_bytes": max(held)} if held else {})}


def out_of_memory_line(entry: dict[str, Any]) -> str:
    """One out-of-memory in words (the time table lists them)."""
    def gib(key: str) -> str:
        return f"{entry[key] / 2**30:.1f} GiB" if key in entry else "?"

    where = "beside others" if entry.get("beside") else "alone"
    named = " ".join(part for part in (entry["impl"], entry.get("suite"), entry.get("case")) if part)
    text = f"{named} ({entry.get('mode', '')}), {where}"
    if "requested_bytes" not in entry and "other_processes" not in entry:
        return text + " (the failure gave no figures)"
    text += f": asked {gib('requested_bytes')}, {gib('free_at_failure_bytes')} free"
    if "process_bytes" in entry:
        text += f"; it held {gib('process_bytes')}"
    if "other_processes" in entry:
        text += f"; {entry['other_processes']} other process(es) held {gib('other_bytes')}"
        if "largest_other_bytes" in entry:
            text += f", the most {gib('largest_other_bytes')}"
    return text
