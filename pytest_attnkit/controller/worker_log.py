"""A worker's log: its stdout and stderr, kept within a size, its start and its end.

A worker writes into a pipe, not into its log file; a thread in the pytest process drains the
pipe into the file. The first :data:`HEAD_BYTES` go to the file as they come (how the worker
started: imports, warnings); after that only the last :data:`TAIL_BYTES` are kept, in memory, and
written after the head, behind a line that says how many bytes were cut, once the pipe closes
(the worker and everything it started have ended). So a kernel that prints a megabyte per call
keeps its log under a megabyte, and the end of the log, where faulthandler writes a crashed
worker's traceback, is always there; :meth:`WorkerLog.tail` reads it for a failure's message.

A run keeps its workers' logs in a temporary folder of its own (:func:`log_folder`), named with
its pid and removed when the run ends; a run killed outright (SIGKILL) cannot remove it, so each
run removes the folders of runs that are no longer alive when it starts.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

HEAD_BYTES = 256 * 1024
TAIL_BYTES = 256 * 1024
#: How long reading the tail waits for the pipe to close (the worker's end to be drained).
DRAIN_WAIT_S = 2.0


LOG_FOLDER_PREFIX = "attnkit-workers-"


def log_folder() -> Path:
    """A new temporary folder for this run's worker logs, after removing those of dead runs."""
    parent = Path(tempfile.gettempdir())
    for folder in parent.glob(f"{LOG_FOLDER_PREFIX}*"):
        owner = re.match(rf"{LOG_FOLDER_PREFIX}(\d+)-", folder.name)
        if owner is None or not folder.is_dir():
            continue  # not named by a run (an older version's): whose it is cannot be told
        try:
            os.kill(int(owner.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            pass  # another user's live process
    return Path(tempfile.mkdtemp(prefix=f"{LOG_FOLDER_PREFIX}{os.getpid()}-", dir=parent))


def cut_notice(cut: int) -> bytes:
    return (f"\n[attnkit: {cut} bytes of this worker's output were cut here; the first {HEAD_BYTES} and "
            f"the last {TAIL_BYTES} are kept]\n").encode()


class WorkerLog:
    """The log file of one worker process, fed through a pipe (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        read_end, self._write_end = os.pipe()
        self._file = open(path, "wb")
        self._head_left = HEAD_BYTES
        self._tail = bytearray()
        self.cut = 0
        self._lock = threading.Lock()
        self._drained = threading.Event()
        threading.Thread(target=self._drain, args=(read_end,), name=f"attnkit-log-{path.name}", daemon=True).start()

    def writer(self) -> int:
        """The pipe's end the worker writes into (its stdout and stderr)."""
        return self._write_end

    def started(self) -> None:
        """The worker holds its end now: close this process's copy, so the pipe closes with it."""
        if self._write_end >= 0:
            os.close(self._write_end)
            self._write_end = -1

    def _drain(self, read_end: int) -> None:
        try:
            while True:
                chunk = os.read(read_end, 1 << 16)
                if not chunk:
                    break
                with self._lock:
                    self._take(chunk)
        finally:
            os.close(read_end)
            with self._lock:
                if self.cut:
                    self._file.write(cut_notice(self.cut))
                self._file.write(self._tail)
                self._file.close()
            self._drained.set()

    def _take(self, chunk: bytes) -> None:
        if self._head_left > 0:
            head = chunk[:self._head_left]
            self._file.write(head)
            self._file.flush()
            self._head_left -= len(head)
            chunk = chunk[len(head):]
        if chunk:
            self._tail += chunk
            if len(self._tail) > TAIL_BYTES:
                self.cut += len(self._tail) - TAIL_BYTES
                del self._tail[:len(self._tail) - TAIL_BYTES]

    def tail(self, size: int) -> bytes:
        """The last ``size`` bytes of the log, after waiting a moment for the pipe to close."""
        self._drained.wait(DRAIN_WAIT_S)
        with self._lock:
            if self._drained.is_set():
                try:
                    with open(self.path, "rb") as stream:
                        stream.seek(max(0, os.fstat(stream.fileno()).st_size - size))
                        return stream.read()
                except OSError:
                    return b""
            kept = (cut_notice(self.cut) if self.cut else b"") + bytes(self._tail)
            if len(kept) >= size:
                return kept[-size:]
            try:
                with open(self.path, "rb") as stream:
                    head = stream.read(HEAD_BYTES)
            except OSError:
                head = b""
            return (head + kept)[-size:]


#: A thread's heading in a faulthandler dump.
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$")
_FRAME = re.compile(r'^\s+File ".*", line \d+ in \S+')
#: How many of a thread's innermost frames a failure's excerpt keeps: the thread the dump was
#: taken in (where a hung or crashed worker was), and each other thread.
CURRENT_FRAMES = 16
OTHER_FRAMES = 3


def excerpt(text: str, size: int) -> str:
    """The end of a worker's log for a failure's message, at most about ``size`` characters.

    Where the log ends in a faulthandler dump (a hung worker asked where it is, a crashed one),
    each thread keeps its innermost frames and says how many outer frames it left out: a dump
    of a thread deep in torch.compile has some 40 frames of 100-odd characters each, and the last
    ``size`` characters of it were the outermost ones (runpy, the worker's loop), not the frame it
    was stuck in, which depended on how long the paths of a machine's virtual environment are."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if _THREAD.match(line) or line.startswith("Fatal Python error")),
                 None)
    if first is None:
        return text[-size:]
    kept: list[str] = []
    frames = skipped = 0
    limit = OTHER_FRAMES
    for line in lines[first:]:
        heading = _THREAD.match(line)
        if heading or not _FRAME.match(line):
            if skipped:
                kept.append(f"  ... {skipped} outer frame(s) left out")
            frames = skipped = 0
            if heading:
                limit = CURRENT_FRAMES if line.startswith("Current") else OTHER_FRAMES
            kept.append(line)
        elif frames < limit:
            frames += 1
            kept.append(line)
        else:
            skipped += 1
    if skipped:
        kept.append(f"  ... {skipped} outer frame(s) left out")
    dump = "\n".join(kept)
    before = "\n".join(lines[:first])
    room = size - len(dump) - 1  # what the log held before the dump fills what is left, and its newline
    return before[-room:] + "\n" + dump if room > 0 and before else dump
