"""The bundled suites' worker handlers (:class:`~pytest_attnkit.worker.suite.SuiteHandler`), one
module per suite, each named by its suite's ``Suite.handler``. They only call the engines, which
stay where they are (:mod:`pytest_attnkit.worker.correctness`, ``memory``, ``speed``,
``properties``, ``guards``), and import them inside ``handle``: a worker imports every selected
suite's handler at start."""
