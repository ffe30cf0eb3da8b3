"""The scheduler's policies, one per module (the scheduler itself, the queue and its threads, is
:mod:`pytest_attnkit.controller.scheduler`; the workers are the pool's,
:mod:`pytest_attnkit.controller.pool`). All of it runs in the pytest process, on the pytest
thread (submit, wait), the dispatcher thread (what starts next) and the jobs' threads (what a
reply means for the queue).

- :mod:`~pytest_attnkit.controller.scheduling.job`: :class:`Job`, one request submitted ahead of its test.
- :mod:`~pytest_attnkit.controller.scheduling.admission`: the device-memory budget and the hold
  of a request that waits for room (``MAX_HOLD_S``).
- :mod:`~pytest_attnkit.controller.scheduling.order`: which ready request starts first (the awaited
  one and what it waits for, then the most work left per running request).
- :mod:`~pytest_attnkit.controller.scheduling.durations`: how long each request took last time, per
  GPU, in the compile-cache folder: the long ones start first.
- :mod:`~pytest_attnkit.controller.scheduling.pruning`: what is cancelled unrun (warm-ups of an
  implementation that compiles nothing and whose first calls build nothing, a chain's requests
  whose ``follows`` says no).
- :mod:`~pytest_attnkit.controller.scheduling.oom_retry`: an out-of-memory run again alone, then
  with room made, and which reply counts.
- :mod:`~pytest_attnkit.controller.scheduling.submission`: what both schedulers (the threaded one
  and :class:`~pytest_attnkit.controller.inline.InlineScheduler`) do with a submitted request.

Nothing here calls the pool (``oom_retry`` reads one constant of it, ``ROOM_ROUNDS``); the pool
imports nothing of the scheduler.
"""
