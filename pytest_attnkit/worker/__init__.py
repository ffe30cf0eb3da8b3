"""The worker side: everything here runs in a worker process, never in the pytest process.

A worker loads one implementation, runs the suites' requests against it (correctness against
the oracle, the memory meter, the timer) and answers with records
(:mod:`pytest_attnkit.records`). Entry: ``python -m pytest_attnkit.worker --fd N``.
"""
