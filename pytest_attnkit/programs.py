"""Programs: the kernels one call launches, as the speed gate compares them (no torch here).

A worker writes a program (:func:`describe`) as the call's kernel launches in order, each
``name grid=.. block=.. smem=.. regs=..``, joined by ``" | "``; a kernel launched several times in
a row counts once. The launches that together take at most :data:`MINOR_SHARE` of the kernel time
of the profiled call, the shortest first, carry :data:`MINOR_MARK`: a compiler that autotunes its
small kernels (TorchInductor's reductions around FlexAttention's template, each timed in the
process that first runs it) makes another program of the same attention kernel in another
process, which the gate would leave ungated (``docs/speed.md``, "another program").

The controller reads them back: :func:`plain` is the program without the marks (two runs of one
program compare equal whatever their kernels' shares were, and programs saved before the marks
existed compare equal to their marked twins); :func:`core` is the launches without a mark, the
kernels that make at least 99% of the call's kernel time (None where the program carries no
mark: saved before the marks, every kernel counts, or a duration was missing). Two programs with
one core differ only in kernels that took at most 1% of either call: they can move a comparison
by about 1%, so a slowdown past the gate's threshold (8%) needs about 7% of the core's own. The
share is one profiled call's (read at warm-up, without the timer's L2 flush), so it is an estimate:
1%, not the threshold's 8%, leaves room for it.
"""

from __future__ import annotations

#: The share of a call's kernel time its minor launches may take together, at most. torch_flex's
#: backward at 16k on an H200 (12 ms): its delta reduction reads O and dO, 128 MB, about 0.03 ms
#: at the copy bandwidth by count (not measured; the next GPU session's saves show what was marked).
MINOR_SHARE = 0.01
#: Appended to a minor launch (a launch ends with its ``regs=N`` otherwise).
MINOR_MARK = " ~minor"
SEPARATOR = " | "


def describe(launches: list[tuple[str, float]]) -> str | None:
    """The program of ``launches``, (launch, duration) in launch order (any time unit):
    consecutive equal launches merged, their durations summed; the shortest marked
    :data:`MINOR_MARK` while their sum stays within :data:`MINOR_SHARE` of the total. No mark at
    all where a duration is missing or not above 0: a kernel of unknown time is no one's minor.
    None for no launch."""
    merged: list[list] = []
    for launch, duration in launches:
        duration = float(duration or 0.0)
        if merged and merged[-1][0] == launch:
            merged[-1][1] += duration
        else:
            merged.append([launch, duration])
    if not merged:
        return None
    total = sum(duration for _, duration in merged)
    minor: set[int] = set()
    spent = 0.0
    timed = all(duration > 0 for _, duration in merged)
    for index in sorted(range(len(merged)), key=lambda i: merged[i][1]):
        if not timed or spent + merged[index][1] > MINOR_SHARE * total:
            break
        spent += merged[index][1]
        minor.add(index)
    return SEPARATOR.join(launch + (MINOR_MARK if index in minor else "") for index, (launch, _) in enumerate(merged))


def _launches(program: str) -> list[str]:
    return program.split(SEPARATOR)


def plain(program: str) -> str:
    """``program`` without its minor marks."""
    return SEPARATOR.join(launch.removesuffix(MINOR_MARK) for launch in _launches(program))


def core(program: str) -> str | None:
    """The launches of ``program`` that carry no minor mark, or None where none carries one."""
    launches = _launches(program)
    if not any(launch.endswith(MINOR_MARK) for launch in launches):
        return None
    return SEPARATOR.join(launch for launch in launches if not launch.endswith(MINOR_MARK))
