"""The pytest side: everything here runs in the pytest process, which never imports torch.

The session (:mod:`.session`) wires the parts of a run: the worker pool (:mod:`.pool`,
:mod:`.process`), one check per suite (:mod:`.correctness`, :mod:`.memory`, :mod:`.speed`), the
one function that turns a worker's reply into a test outcome (:mod:`.outcome`), the gate and its
baseline files (:mod:`.gate`, :mod:`.baselines`), and the report (:mod:`.report`, rendered by
:mod:`.table` and :mod:`.plots`).
"""
