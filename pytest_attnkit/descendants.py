"""The processes a worker started, and how they end with it (Linux; elsewhere the process group).

An implementation may start processes of its own: a compile server, a helper binary, a pool of
compile workers (TorchInductor's), a daemon that calls ``setsid`` to leave its parent's session.
None may outlive the worker, however the worker ends. Three things see to it, in both processes:

- **The worker is a subreaper** (:func:`become_subreaper`: Linux's ``PR_SET_CHILD_SUBREAPER``):
  a process it started, whose own parent exits (a daemon's double fork), is re-parented to the
  worker rather than to PID 1, so every process it started stays below it in the process tree
  for as long as it lives, process group or not.
- **Whoever ends a live worker ends its tree** (:func:`kill_tree`): the worker itself before it
  exits (on ``shutdown``, at the end of its socket, when its pytest process is gone), or the
  pytest process when it kills the worker (a deadline, a run that stops). The tree is frozen
  first (SIGSTOP, walked again until nothing new appears), so nothing forks while it is killed.
- **The pytest process sweeps by a mark** (:func:`kill_marked`): every worker starts with
  :data:`MARK` in its environment, with a value of its own, which its children inherit. When a
  worker has ended, the pytest process kills its process group and every process that still
  carries its mark: this finds what a worker that crashed (a segfault, an abort, ``os._exit``)
  left behind, which no tree holds any more.

Not covered: a process that left a worker that crashed *and* dropped the mark from its
environment (``env -i``, a daemon that clears its environment) and left the process group
(``setsid``); a process of another user (``sudo``), which cannot be signalled; and work an
implementation hands to a process that was running before it (a server it talks to over a
socket). Elsewhere than Linux only the process group is killed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import time

#: The environment variable each worker gets, with a value of its own (see the module docstring).
MARK = "ATTNKIT_WORKER_ID"
PR_SET_CHILD_SUBREAPER = 36
#: How often :func:`kill_tree` walks the tree again for processes forked while it was stopping.
FREEZE_ROUNDS = 20
PROC = "/proc"


def supported() -> bool:
    return sys.platform.startswith("linux") and os.path.isdir(PROC)


def become_subreaper() -> bool:
    """Make orphans of this process's descendants its children (Linux); whether it took."""
    if not supported():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, int]:
    """Every visible process's parent: pid -> ppid."""
    parents = {}
    for entry in os.listdir(PROC):
        if not entry.isdigit():
            continue
        try:
            with open(f"{PROC}/{entry}/stat", "rb") as stream:
                stat = stream.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ")".
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            parents[int(entry)] = int(fields[1])
    return parents


def descendants(root: int) -> list[int]:
    """The processes below ``root`` in the process tree, parents before their children."""
    if not supported():
        return []
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    found, frontier = [], [root]
    while frontier:
        below = [child for pid in frontier for child in children.get(pid, ()) if child != root]
        found += below
        frontier = below
    return found


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def kill_tree(root: int, *, include_root: bool) -> list[int]:
    """Kill every process below ``root`` (and ``root`` too, with ``include_root``): stop them
    all, walking the tree again until no new process appears, then kill them. Returns the pids
    killed below ``root``."""
    if not supported():
        return []
    if include_root:
        _signal(root, signal.SIGSTOP)
    stopped: set[int] = set()
    for _ in range(FREEZE_ROUNDS):
        fresh = [pid for pid in descendants(root) if pid not in stopped]
        if not fresh:
            break
        for pid in fresh:
            _signal(pid, signal.SIGSTOP)
        stopped.update(fresh)
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    if include_root:
        _signal(root, signal.SIGKILL)
    return sorted(stopped)


def end_descendants() -> list[int]:
    """Kill every process this one started (it is a subreaper: see the module docstring) and
    reap those that are its children, before it exits. Returns the pids killed."""
    killed = kill_tree(os.getpid(), include_root=False)
    deadline = time.monotonic() + 2.0
    while killed and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.01)
    return killed


def marked(value: str) -> list[int]:
    """The processes whose environment carries ``MARK=value`` (this user's; others cannot be read)."""
    if not supported():
        return []
    needle = f"{MARK}={value}".encode()
    found = []
    for entry in os.listdir(PROC):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"{PROC}/{entry}/environ", "rb") as stream:
                variables = stream.read().split(b"\0")
        except OSError:
            continue
        if needle in variables:
            found.append(int(entry))
    return found


def kill_marked(value: str) -> list[int]:
    """Kill, with their trees, the processes that carry ``MARK=value``; returns their pids."""
    found = marked(value)
    for pid in found:
        _signal(pid, signal.SIGSTOP)
    for pid in found:
        kill_tree(pid, include_root=True)
    return found
