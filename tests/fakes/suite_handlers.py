"""Worker handlers for tests/worker/test_server.py: one that answers and says what it was asked and
told to forget, and things that are no handler. Imported by the handler registry from the path
the test names (``suite_handlers:Recording``), as a worker imports a suite's handler."""

from pytest_attnkit.messages import Reply, Request, Status
from pytest_attnkit.worker.suite import SuiteHandler, WorkerContext


class Recording(SuiteHandler):
    """Answers OK with the case's id and how many times it was told to forget."""

    def __init__(self) -> None:
        self.forgotten = 0

    def handle(self, context: WorkerContext, request: Request) -> Reply:
        return Reply(Status.OK, data={"case": request.case.id, "forgotten": self.forgotten,
                                      "device": context.device})

    def forget(self) -> None:
        self.forgotten += 1


class NotAHandler:
    """Has a handle method, but is no SuiteHandler."""

    def handle(self, context, request):
        return Reply(Status.OK)


INSTANCE = Recording()
