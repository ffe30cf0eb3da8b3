"""A suite handler module that fails to import (tests/worker/test_server.py)."""

raise RuntimeError("the handler module of a suite broke at import")
