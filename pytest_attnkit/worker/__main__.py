"""``python -m pytest_attnkit.worker --fd N``: a worker, started by the pytest process."""

from __future__ import annotations

import argparse

from pytest_attnkit.worker.server import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="pytest-attnkit worker (started by the plugin, not by hand)")
    parser.add_argument("--fd", type=int, required=True, help="socket file descriptor to the pytest process")
    args = parser.parse_args(argv)
    serve(args.fd)


if __name__ == "__main__":
    main()
