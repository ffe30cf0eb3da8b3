"""Every view a person reads, rendered in one place: the header, the terminal summary, the Markdown.

The summary and the Markdown render from the report document
(:func:`pytest_attnkit.controller.report.build`), never from the live session, so the terminal,
the report files and the job summary of a CI run always agree. Terminal lines stay within
:data:`~pytest_attnkit.controller.terminal.WIDTH` columns: long values wrap, and detail that does
not fit (IQR, launch time) shows with ``-v`` and in the report files.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from pytest_attnkit.contract import MemoryClass
from pytest_attnkit.controller.gate import GateVerdict
from pytest_attnkit.controller.impls import ImplStatus
from pytest_attnkit.controller.ledger import out_of_memory_line, timeline_line
from pytest_attnkit.controller.options import SUITES
from pytest_attnkit.controller.outcome import Verdict
from pytest_attnkit.controller.paired import SyncKind
from pytest_attnkit.controller.terminal import NO_BREAK, WIDTH, wrap
from pytest_attnkit.properties import PROPERTIES
from pytest_attnkit.records import PointStatus

if TYPE_CHECKING:
    from pytest_attnkit.controller.against import Revision
    from pytest_attnkit.controller.baselines import BaselineStore

#: The speed figures the summary shows per implementation: the forward at FlashAttention's
#: shapes with head dim 128 (batch x length = 16k tokens), at these lengths.
HEADLINE_LENGTHS = (4096, 16384)


#: The most of a skip reason the summary's correctness line quotes (the report files have it whole).
REASON_WIDTH = 60


def shorten(text: str, width: int) -> str:
    """``text`` cut to at most ``width`` columns at a word boundary, with "..." where it was cut."""
    short = textwrap.shorten(text, width=width, placeholder=" ...", break_on_hyphens=False)
    return text if short == "..." else short  # one word longer than the width: whole, and wrapped


def format_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def name_width(names: Iterable[str]) -> int:
    """The width of a column of implementation names: the longest, and 16 at least, so that
    the columns after it line up whatever the names."""
    return max([16, *map(len, names)])


# -- a table built once, rendered to the terminal and to Markdown ---------------------------------


@dataclass(frozen=True)
class Cell:
    """One value of a row, as the terminal shows it and as Markdown does (the same unless given)."""

    terminal: str
    markdown: str

    @classmethod
    def of(cls, terminal: str, markdown: str | None = None) -> "Cell":
        return cls(terminal, terminal if markdown is None else markdown)


@dataclass(frozen=True)
class Column:
    """A column's header on the terminal and in Markdown; None: the column is not shown there."""

    terminal: str | None
    markdown: str | None
    right: bool = False  # right-aligned on the terminal
    width: int = 0  # the terminal's fixed width for it (a table of fixed widths; 0: as wide as it takes)


@dataclass
class Section:
    """A table of the report: its rows built once from the document, rendered by
    :func:`terminal_table` and :func:`markdown_table`."""

    columns: list[Column]
    rows: list[list[Cell]] = field(default_factory=list)

    def add(self, *cells: Cell | str) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"a row of {len(cells)} cells in a table of {len(self.columns)} columns: {cells}")
        self.rows.append([cell if isinstance(cell, Cell) else Cell.of(cell) for cell in cells])


def terminal_table(section: Section) -> list[str]:
    """The section's terminal columns: aligned within :data:`WIDTH` (:func:`_columns`), or, where
    the columns have fixed widths, each row at those widths under two spaces of indent, a row too
    long wrapped under its last column."""
    shown = [index for index, column in enumerate(section.columns) if column.terminal is not None]
    columns = [section.columns[index] for index in shown]
    header = [column.terminal or "" for column in columns]
    body = [[row[index].terminal for index in shown] for row in section.rows]
    if not all(column.width for column in columns[:-1]):
        return _columns([header, *body], right={i for i, column in enumerate(columns) if column.right})

    def line(cells: list[str]) -> str:
        return "  " + "  ".join(cell.rjust(column.width) if column.right else cell.ljust(column.width)
                                for cell, column in zip(cells, columns))

    indent = " " * (2 + sum(column.width + 2 for column in columns[:-1]))
    lines = [line(header)]
    for cells in body:
        lines += wrap(line(cells).rstrip(), indent)
    return lines


def markdown_table(section: Section) -> list[str]:
    """The section's Markdown columns: a pipe table."""
    shown = [index for index, column in enumerate(section.columns) if column.markdown is not None]
    return (["| " + " | ".join(section.columns[index].markdown or "" for index in shown) + " |",
             "|" + "---|" * len(shown)]
            + ["| " + " | ".join(row[index].markdown for index in shown) + " |" for row in section.rows])


# -- the header -------------------------------------------------------------------------------


def header_lines(*, environment: dict[str, Any], device: str, profile: str, suites: list[str], seed: int,
                 workers: str, caches: str, impls: Iterable[Any], suite_lines: Iterable[str] = (),
                 warning: str | None) -> list[str]:
    """The run's header; ``suite_lines``: the suites' own (Suite.header_lines), each after ``attnkit:``."""
    env = environment
    name = env.get("device_name", "?")
    if device == "cuda":
        where = f"cuda: {name} (compute capability {env.get('compute_capability')}, CUDA {env.get('cuda_runtime')})"
    else:
        reason = "no CUDA device" if not env.get("cuda_available") else "chosen"
        where = f"cpu: {name} ({reason}; Triton kernels run in its interpreter)"
    versions = ", ".join(f"{lib} {env.get(lib) or 'not installed'}" for lib in ("torch", "triton", "cupy", "numpy"))
    lines = [
        *wrap(f"attnkit: device {where}", "attnkit:   "),
        *wrap(f"attnkit: {versions}; python {env.get('python')}", "attnkit:   "),
        *wrap(f"attnkit: profile {profile}, suites {', '.join(suites)}, seed {seed}; {workers}", "attnkit:   "),
        *wrap(f"attnkit: {caches}", "attnkit:   "),
    ]
    for line in suite_lines:
        lines += wrap(f"attnkit: {line}", "attnkit:   ")
    if warning:
        lines += wrap(f"attnkit: WARNING: {warning}", "attnkit:   ")
    impls = list(impls)
    if not impls:
        lines.append("attnkit: no implementations selected")
    width = name_width(info.name for info in impls)
    indent = "attnkit:" + " " * (width + 4)
    for info in impls:
        if info.load_error:
            text = info.load_error.strip()
            state = f"BROKEN: {text.splitlines()[-1] if text else '?'}"
        elif info.unavailable:
            state = f"unavailable: {info.unavailable}"
        else:
            caps = info.capabilities
            state = (f"available ({caps.get('memory_class') or 'undeclared'} memory, "
                     f"{'fwd+bwd' if caps.get('backward') else 'fwd only'})")
        line = f"attnkit:   {info.name:<{width}} {state}  [{info.origin}]"
        if len(line) <= WIDTH:
            lines.append(line)
        else:  # the entry point on a line of its own
            lines += wrap(f"attnkit:   {info.name:<{width}} {state}", indent)
            lines += wrap(f"{indent}[{info.origin}]", indent)
        if info.path_note and not (info.load_error or info.unavailable):
            lines += wrap(f"{indent}{info.path_note}", indent)
    return lines


def gate_header(store: "BaselineStore", *, require_baseline: bool, revision: "Revision | None") -> str:
    """The header's gate line: the baseline file speed is gated against, or that nothing will be;
    with --attnkit-against, the A/B against REV and the stored baseline beside it."""
    gate = (f"speed is gated against {store.path} ({len(store.entries)} entries)" if store.found else
            f"NOTHING WILL BE GATED: no baseline for {store.device_name} ({store.path} does not exist)"
            + ("; required, so every speed test fails" if require_baseline else ""))
    if revision is not None:
        stored = f"{store.path} ({len(store.entries)} entries)" if store.found else f"none for {store.device_name}"
        gate = (f"A/B against {revision.description}, interleaved and paired "
                f"({', '.join(sorted(revision.counterparts.values()))}); stored baseline: {stored}")
    if store.removed:
        gate += f"; removed {len(store.removed)} temporary file(s) that a killed save left in {store.path.parent}"
    return gate


def workers_header(*, inprocess: bool, xdist_controller: bool, jobs: int) -> str:
    """How the run's requests run: in-process, in pytest-xdist's workers, several at once or one at a time."""
    if inprocess:
        return "in-process"
    if xdist_controller:
        return "pytest-xdist workers, each with workers of its own"
    if jobs > 1:
        return f"up to {jobs} requests at once (--attnkit-jobs), memory and speed alone"
    return "one request at a time (--attnkit-jobs=1)"


def sanitize_header(sanitizer: str, tools: list[str], reason: str | None) -> str:
    """The header's sanitize line: compute-sanitizer and its tools, or why it will not run (``reason``)."""
    if reason is None:
        return f"sanitize: {sanitizer} ({', '.join(tools)})"
    guarded = "memcheck's tests run on guarded inputs; " if "memcheck" in tools else ""
    return f"sanitize: {guarded}compute-sanitizer NOT RUN: {reason}"


# -- the summary ------------------------------------------------------------------------------


def correctness_verdict(document: dict[str, Any], name: str, suite: str = "correctness") -> str:
    """pass, FAIL, NOTHING RUN or INCOMPLETE, with the coverage: how many of the implementation's
    tests ran of how many (of the correctness suite, where a case makes a forward and a backward
    test, or of ``suite``: a suite installed through attnkit.suites)."""
    info = document["implementations"][name]
    if info["status"] != ImplStatus.AVAILABLE:
        return info["status"]
    counts = Counter(test["outcome"] for test in document["tests"]
                     if test["impl"] == name and test["suite"] == suite)
    collected = document.get("collected", {}).get(name, {}).get(suite, sum(counts.values()))
    if not collected:
        return "not run"
    passed, failed, skipped = counts[Verdict.PASSED], counts[Verdict.FAILED], counts[Verdict.SKIPPED]
    ran = passed + failed
    stand_ins = sum(1 for test in document["tests"] if test["impl"] == name and test["suite"] == suite
                and test.get("twin_of") and test["outcome"] in (Verdict.PASSED, Verdict.FAILED))
    coverage = (f"{ran} of {collected} tests run ({passed} passed, {failed} failed"
                + (f"; {stand_ins} as in-contract stand-ins" if stand_ins else "") + f"), {skipped} skipped")
    reasons = Counter(test.get("reason") for test in document["tests"]
                      if test["impl"] == name and test["suite"] == suite and test["outcome"] == Verdict.SKIPPED)
    if reasons:
        why, _ = reasons.most_common(1)[0]
        if why:
            coverage += f" (mostly: {shorten(why, REASON_WIDTH)})"
    if failed:
        verdict = "FAIL"
    elif document["interrupted"] or sum(counts.values()) < collected:
        verdict = "INCOMPLETE"
    elif not ran:
        verdict = "NOTHING RUN"
    else:
        verdict = "pass"
    return f"{verdict}: {coverage}"


def accuracy_headline(document: dict[str, Any], name: str) -> str:
    """Which rules judged the implementation's correctness tests, and its worst headroom (the
    largest error / allowed over every comparison, passed or failed) with where it was."""
    declared = document["implementations"][name].get("capabilities", {}).get("accuracy", "exact")
    rules: Counter[str] = Counter()
    worst: tuple[float, str, str] | None = None
    for test in document["tests"]:
        if test["impl"] != name or test["suite"] != "correctness" or not test.get("comparisons"):
            continue
        comparisons = test["comparisons"]
        rule = comparisons[0]["rule"]
        if rule == "quantized":
            rule = (comparisons[0].get("budget") or "quantized").split(" budget", 1)[0]
        rules[rule] += 1
        for comparison in comparisons:
            if worst is None or comparison["headroom"] > worst[0]:
                worst = (comparison["headroom"], comparison["name"], test["case"] or "?")
    if worst is None:
        declared_name = declared if isinstance(declared, str) else declared.get("name", "custom")
        return f"{declared_name} (declared); no correctness figures"
    judged = ", ".join(f"{rule} rule" + (f" on {count} tests" if len(rules) > 1 else "")
                       for rule, count in rules.most_common())
    return f"{judged}; worst headroom {worst[0]:.2f} ({worst[1]}, {worst[2]})"


def _headline_speed(document: dict[str, Any], name: str) -> str:
    ceilings = document["speed"]["ceilings"]
    figures = []
    for m in document["speed"]["measurements"]:
        shape = m["shape"]
        if (m["impl"] == name and m["mode"] == "forward" and shape["head_dim"] == 128 and not shape["causal"]
                and not shape.get("seqlens_k") and not shape["dtype"].startswith("float8")
                and shape["seqlen_q"] == shape["seqlen_k"] in HEADLINE_LENGTHS
                and shape["batch"] * shape["seqlen_q"] == 16384):
            share = f" ({100 * m['tflops'] / ceilings['matmul_bf16_tflops']:.0f}% of matmul)" if ceilings else ""
            figures.append((shape["seqlen_q"], f"{m['tflops']:.0f} TFLOP/s at N={shape['seqlen_q']}{share}"))
    return "; ".join(text for _, text in sorted(figures))


def speed_headline(document: dict[str, Any], name: str) -> str:
    """The summary's speed figures for one implementation: TFLOP/s at the headline shapes, else how
    many cases the speed table holds for it (the smoke set on the CPU has no headline shape)."""
    figures = _headline_speed(document, name)
    if figures:
        return figures
    modes = Counter(m["mode"] for m in document["speed"]["measurements"] if m["impl"] == name)
    if not modes:
        return "-"
    count = sum(modes.values())
    split = ", ".join(f"{modes[mode]} {_MODES.get(mode, mode)}" for mode in ("forward", "backward") if modes[mode])
    return (f"{count} case{'' if count == 1 else 's'} timed ({split}), in the speed table; none at the "
            f"headline shape (forward, d128, N={' or '.join(map(str, HEADLINE_LENGTHS))})")


def _runs_of(decisions: list[dict[str, Any]]) -> str:
    """How many saved runs the baseline entries behind these verdicts hold: "3-8 runs" or "1 run"."""
    runs = sorted(decision.get("baseline_runs", 1) for decision in decisions)
    span = f"{runs[0]}" if runs[0] == runs[-1] else f"{runs[0]}-{runs[-1]}"
    return f"{span} run{'' if span == '1' else 's'}"


def gate_headline(document: dict[str, Any], name: str) -> str:
    """The gate's verdict for one implementation, with the counts of each verdict and the runs
    the baseline entries behind them hold (a regression against an entry of one run says so)."""
    decisions = [decision for decision in document["speed"]["gate"] if decision["impl"] == name]
    verdicts = Counter(decision["verdict"] for decision in decisions)
    timed = any(m["impl"] == name for m in document["speed"]["measurements"])
    if verdicts:
        gate = "REGRESSION" if verdicts[GateVerdict.REGRESSION] else "ok"
        parts = []
        for verdict, count in sorted(verdicts.items()):
            behind = [decision for decision in decisions if decision["verdict"] == verdict]
            parts.append(f"{count} {verdict}" + (f" against entries of {_runs_of(behind)}"
                                                 if verdict == GateVerdict.REGRESSION else ""))
        by_core = sum(decision.get("judged_by") == "core" for decision in decisions)
        core = f"; {by_core} judged against the saved runs of their core kernels" if by_core else ""
        return gate + " (" + ", ".join(parts) + f"{core}; baselines of {_runs_of(decisions)})"
    if timed:
        return "NOT GATED: " + ("no baseline file for this device" if not document["speed"].get("baseline_found")
                                else "no baseline entries for its cases")
    return "not run"


def memory_figure(sweep: dict[str, Any]) -> str:
    """A sweep in a few words: its exponent, or that no power law describes it."""
    if sweep.get("verdict") == MemoryClass.UNCLEAR:
        return f"{MemoryClass.UNCLEAR}" + (f" (N^{sweep['slope']:.2f})" if sweep["slope"] is not None else "")
    return "flat" if sweep["slope"] is None else f"N^{sweep['slope']:.2f}"


def property_verdicts(document: dict[str, Any], name: str) -> list[str]:
    """Per check that ran: "holds" where every case held; "FAILS" where a case it was declared for
    did not; "no" where only cases it was not declared for did not (determinism declared for the
    forward only, and the backward's bits differing). With how many of its cases held, and where
    the declaration covers only some cases, how many it covers."""
    verdicts = []
    for check in PROPERTIES:  # the summary's order, under their titles
        ran = [entry for entry in document.get("properties", []) if entry["impl"] == name and entry["check"] == check.name]
        if not ran:
            continue
        held = sum(bool(entry["holds"]) for entry in ran)
        declared = sum(bool(entry["declared"]) for entry in ran)
        broken = any(entry["declared"] and not entry["holds"] for entry in ran)
        verdict = "holds" if held == len(ran) else ("FAILS" if broken else "no")
        scope = "" if not declared else (", declared" if declared == len(ran) else f", declared for {declared}")
        verdicts.append(f"{check.title} {verdict} ({held}/{len(ran)}{scope})")
    return verdicts


def installed_suites(document: dict[str, Any]) -> list[str]:
    """The suites of the run's tests that came through the attnkit.suites entry points (not the
    bundled five, which have rows of their own), in name order."""
    return sorted({test["suite"] for test in document["tests"]} - set(SUITES))


def verdict_suites(document: dict[str, Any]) -> list[str]:
    """The suites whose summary row is their tests' outcomes, counted as correctness's are: sanitize
    when the run collected its tests, then the installed suites."""
    ran = {suite for suites in document.get("collected", {}).values() for suite, count in suites.items() if count}
    ran |= {test["suite"] for test in document["tests"]}
    return (["sanitize"] if "sanitize" in ran else []) + installed_suites(document)


def headline_lines(document: dict[str, Any]) -> list[str]:
    """A block per implementation: correctness, accuracy, memory, speed, gate and the properties,
    each on its own line (accuracy only where correctness ran), then a line for sanitize and one per
    installed suite (their tests' outcomes, as correctness's)."""
    lines = []
    width = name_width(document["implementations"])
    # Sanitize's verdict reads like correctness's: its tests' outcomes (when it ran).
    by_outcomes = verdict_suites(document)
    for name in document["implementations"]:
        memory = ", ".join(f"{sweep['direction']} {memory_figure(sweep)}"
                           for sweep in document["memory"] if sweep["impl"] == name)
        correctness = correctness_verdict(document, name)
        rows = [("correctness", correctness)]
        if document["implementations"][name]["status"] == ImplStatus.AVAILABLE and correctness != "not run":
            rows.append(("accuracy", accuracy_headline(document, name)))
        rows += [("memory", memory or "-"),
                 ("speed", speed_headline(document, name)), ("gate", gate_headline(document, name))]
        verdicts = property_verdicts(document, name)
        if verdicts:
            rows.append(("properties", " · ".join(verdict.replace(" ", NO_BREAK) for verdict in verdicts)))
        rows += [(suite, correctness_verdict(document, name, suite)) for suite in by_outcomes]
        first = True
        for label, value in rows:
            prefix = f"{name if first else '':<{width}} {label:<12} "
            lines += wrap(prefix + value, " " * len(prefix))
            first = False
    return lines


def memory_table(name: str, direction: str, points: list[dict[str, Any]], slope: float | None, verdict: str, *,
                 r2: float | None = None, worst: float | None = None, worst_n: int | None = None,
                 reason: str | None = None, declared: str | None = None) -> list[str]:
    """A sweep as a person reads it: N, peak extra bytes, bytes per token, the model, the fit and
    how well it fits (R^2, the point farthest from the line). An unclear sweep shows why, and no
    class."""
    exponent = "none (no extra memory)" if slope is None else f"{slope:.2f}"
    quality = ""
    if r2 is not None and worst is not None:
        quality = f"R^2 {r2:.3f}, worst point {worst:.2f}x off the line" + (f" at N={worst_n}" if worst_n else "")
    if verdict == MemoryClass.UNCLEAR:
        head = (f"{name} ({direction}): unclear, no class: {reason or 'the fit is poor'}; fitted exponent {exponent}"
                + (f", {quality}" if quality else "")
                + (f"; declared {declared} not enforced" if declared else ""))
    else:
        head = f"{name} ({direction}): fitted exponent {exponent} -> {verdict}" + (f" ({quality})" if quality else "")
    return wrap(head, "    ") + terminal_table(memory_section(points, verdict, worst=worst, worst_n=worst_n))


def memory_section(points: list[dict[str, Any]], verdict: str, *, worst: float | None = None,
                   worst_n: int | None = None) -> Section:
    """A sweep's points: N, the peak extra bytes, bytes per token, the model's bytes and a note
    (what kept a point from being measured, memory outside the meter, the point farthest from the
    line of an unclear sweep)."""
    section = Section([Column("N", "N", right=True, width=7),
                       Column("extra (peak)", "extra bytes", right=True, width=14),
                       Column("bytes/token", "bytes per token", right=True, width=12),
                       Column("model", None, right=True, width=12), Column("note", "note")])
    for point in points:
        if point["status"] != PointStatus.MEASURED:
            section.add(str(point["seqlen"]), Cell("-", str(point["extra_bytes"])), "-", "-",
                        Cell(f"{point['status']}: {point['message']}", str(point["message"])))
            continue
        model = format_bytes(point["expected_bytes"]) if point.get("expected_bytes") is not None else "-"
        notes = [f"unmetered {format_bytes(point['unmetered_bytes'])}"] if point.get("unmetered_bytes") else []
        if verdict == MemoryClass.UNCLEAR and worst is not None and point["seqlen"] == worst_n:
            notes.append(f"{worst:.2f}x off the line")
        section.add(str(point["seqlen"]), Cell(format_bytes(point["extra_bytes"]), str(point["extra_bytes"])),
                    f"{point['extra_bytes'] / point['seqlen']:.1f}", model, Cell(", ".join(notes), ""))
    return section


def memory_lines(document: dict[str, Any]) -> list[str]:
    lines = []
    for sweep in document["memory"]:
        lines += memory_table(sweep["impl"], sweep["direction"], sweep["points"], sweep["slope"], sweep["verdict"],
                              r2=sweep.get("r2"), worst=sweep.get("worst_residual"), worst_n=sweep.get("worst_n"),
                              reason=sweep.get("unclear_reason"), declared=sweep.get("declared"))
        lines.append(f"  largest N that fit: {sweep['largest_n']}" + (f" ({sweep['stopped']})" if sweep.get("stopped") else ""))
    return lines


def _columns(rows: list[list[str]], right: set[int], key: int = 3) -> list[str]:
    """``rows`` (the first one the header) as aligned columns within :data:`WIDTH`: two spaces
    apart, else one, else each row stacked: its first ``key`` cells on one line and the rest,
    named by their headers, on the next."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for gap in ("  ", " "):
        lines = [gap.join(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
                          for i, cell in enumerate(row)).rstrip() for row in rows]
        if max(len(line) for line in lines) <= WIDTH:
            return lines
    header, body = rows[0], rows[1:]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(header[:key])).rstrip()]
    for row in body:
        lines += wrap("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:key])).rstrip(), "    ")
        lines += wrap("    " + "  ".join(f"{name} {cell}" for name, cell in zip(header[key:], row[key:])), "    ")
    return lines


_MODES = {"forward": "fwd", "backward": "bwd"}


def speed_section(document: dict[str, Any], *, verbose: bool = False) -> Section:
    """Every timed case: its time, IQR and launch time (the terminal's with ``-v``), TFLOP/s and
    GB/s with their shares of the run's ceilings (the terminal's, where measured), and its speed
    relative to the reference."""
    speed = document["speed"]
    gpu = document["device"] == "cuda"
    ceilings = speed["ceilings"]
    section = Section([Column("implementation", "implementation"), Column("mode", "mode"), Column("case", "case"),
                       Column("median ms", "median ms", right=True),
                       Column("IQR ms" if verbose else None, "IQR ms", right=True),
                       Column("launch ms" if verbose and gpu else None, None, right=True),
                       Column("TFLOP/s", "TFLOP/s", right=True), Column("%mm" if ceilings else None, None, right=True),
                       Column("GB/s", "GB/s", right=True), Column("%copy" if ceilings else None, None, right=True),
                       Column("x ref", "x ref", right=True)])
    for m in sorted(speed["measurements"], key=lambda m: (m["mode"], m["case"], m["impl"])):
        timing = m["timing"]
        launch = f"{timing['launch_ms']:.4f}" if timing.get("launch_ms") is not None else "-"
        section.add(m["impl"], Cell(_MODES.get(m["mode"], m["mode"]), m["mode"]), m["case"],
                    f"{timing['median_ms']:.4f}", f"{timing['iqr_ms']:.4f}", launch,
                    Cell(f"{m['tflops']:.2f}", f"{m['tflops']:.1f}"),
                    f"{100 * m['share_of_matmul']:.0f}" if ceilings else "", f"{m['gbps']:.1f}",
                    f"{100 * m['share_of_copy']:.0f}" if ceilings else "",
                    f"{1 / m['ratio_to_reference']:.2f}" if m.get("ratio_to_reference") else "-")
    return section


def speed_lines(document: dict[str, Any], *, verbose: bool = False) -> list[str]:
    speed = document["speed"]
    if not speed["measurements"]:
        return []
    gpu = document["device"] == "cuda"
    ceilings = speed["ceilings"]
    lines = []
    if not gpu:
        lines += wrap("CPU numbers: perf_counter around each call on this machine's CPU; they check the plumbing "
                      "and are not GPU figures (the gate needs a doubling to call a CPU case a regression)")
    if ceilings:
        lines += wrap(f"ceilings measured in this run: bf16 matmul {ceilings['matmul_bf16_tflops']:.0f} TFLOP/s, "
                      f"device copy {ceilings['copy_gbps']:.0f} GB/s (read + write); GPU state {speed['gpu_state']}")
    lines += terminal_table(speed_section(document, verbose=verbose))
    lines += wrap("(x ref: speed relative to the reference implementation in this run; above 1 is faster)")
    if gpu:
        lines += wrap("(median: GPU time per call, the stream held until the host had issued the call"
                      + ("; IQR and launch ms (the host's time to issue a call) with -v" if not verbose else
                         "; launch ms: the host's time to issue it, from an idle GPU, not in the GPU figures") + ")")
    calls = first_calls(speed["measurements"])
    if calls:
        lines += wrap("first calls, summed per implementation (compilation and autotuning show here, outside the "
                      "timings; how many cases were timed in the worker that warmed them up): "
                      + ", ".join(f"{name} {seconds:.1f} s ({warm} of {cases})"
                                  for name, (seconds, warm, cases) in sorted(calls.items())), "  ")
    return lines + clock_lines(speed["measurements"])


def first_calls(measurements: list[dict[str, Any]]) -> dict[str, tuple[float, int, int]]:
    """Per implementation, over the timed cases whose first call was timed: its seconds summed,
    how many cases were timed in the worker that warmed them up (``warm_worker``), and how many."""
    totals: dict[str, tuple[float, int, int]] = {}
    for m in measurements:
        took = m.get("timing", {}).get("first_call_ms")
        if took is not None:
            seconds, warm, cases = totals.get(m["impl"], (0.0, 0, 0))
            totals[m["impl"]] = (seconds + took / 1e3, warm + bool(m.get("warm_worker")), cases + 1)
    return totals


#: A case whose slowest sample ran at a clock this far under the run's usual one is named.
CLOCK_DROP = 0.97


def clock_lines(measurements: list[dict[str, Any]]) -> list[str]:
    """The cases timed while the GPU ran slower than it usually did in this run (``Timing``'s
    ``clock_mhz_min`` against the highest of the cases' ``clock_mhz_median``): two kernels compared a
    few percent apart under different clocks are not compared fairly."""
    read = [(m["timing"]["clock_mhz_min"], m["timing"]["clock_mhz_median"], m)
            for m in measurements if m["timing"].get("clock_mhz_min") is not None]
    if not read:
        return []
    usual = max(median for _, median, _ in read)
    slow = sorted(((lowest, m) for lowest, _, m in read if lowest < CLOCK_DROP * usual),
                  key=lambda pair: (pair[0], pair[1]["impl"], pair[1]["case"], pair[1]["mode"]))
    if not slow:
        return []
    shown = ", ".join(f"{m['impl']} {_MODES.get(m['mode'], m['mode'])} {m['case']} {lowest:.0f}"
                      for lowest, m in slow)
    return wrap(f"the SM clock fell during {len(slow)} case(s) (their slowest sample's MHz, against {usual:.0f} MHz, "
                f"the highest median clock of this run: a power or thermal cap; times are as measured): {shown}", "  ")


def gate_section(document: dict[str, Any]) -> Section:
    """The gate's decisions: the baseline's median and runs, now's median, the change, the
    threshold and the verdict (on the terminal, a regression in capitals and k of n rounds)."""
    section = Section([Column("implementation", "implementation"), Column("mode", "mode"), Column("case", "case"),
                       Column("base ms", "baseline ms", right=True), Column("runs", "runs", right=True),
                       Column("now ms", "now ms", right=True), Column("change", "change", right=True),
                       Column("thresh", "threshold", right=True), Column("verdict", "verdict")])
    for d in sorted(document["speed"]["gate"], key=lambda d: (d["impl"], d["mode"], d["case"])):
        verdict = d["verdict"].upper() if d["verdict"] == GateVerdict.REGRESSION else d["verdict"]
        if d["rounds"] > 1:
            verdict += f" {d['rounds_flagged']}/{d['rounds']}"
        core = " (core)" if d.get("judged_by") == "core" else ""  # against its core kernels' runs (speed.py)
        verdict += core
        section.add(d["impl"], Cell(_MODES.get(d["mode"], d["mode"]), d["mode"]), d["case"],
                    f"{d['baseline_median_ms']:.4f}", str(d["baseline_runs"]), f"{d['now_median_ms']:.4f}",
                    f"{100 * (d['ratio'] - 1):+.1f}%", f"{100 * d['threshold']:.1f}%",
                    Cell(verdict, str(d["verdict"]) + core))
    return section


def gate_lines(document: dict[str, Any]) -> list[str]:
    speed = document["speed"]
    if not speed["measurements"]:
        return []
    if not speed.get("baseline_found") and document.get("against"):
        return wrap(f"stored baseline: none for this device ({speed.get('baseline_file')}); the A/B gate "
                    f"against {document['against']['given']} below decides")
    if not speed.get("baseline_found"):
        return wrap(f"NOTHING GATED: no baseline for this device ({speed.get('baseline_file')} does not exist); "
                    "save one with --attnkit-save-baseline, or make a missing baseline fail with "
                    "--attnkit-require-baseline")
    if not speed["gate"]:
        return wrap(f"NOTHING GATED: {speed.get('baseline_file')} has no entries for the cases this run timed")
    lines = [f"gate against {speed.get('baseline_file')}"]
    counts = speed.get("machine_factor_cases")
    over = f" over {counts[0]} of its {counts[1]} cases" if counts and counts[0] < counts[1] else ""
    lines += wrap(f"  machine factor {speed['machine_factor']:.3f} from {speed.get('reference')}{over} (the reference "
                  "itself is gated without it; its cases that synchronize inside the call or whose saved runs "
                  "disagreed are left out); a regression needs Mann-Whitney U at alpha 0.01 and the practical "
                  "threshold, raised where saved runs disagreed", "  ")
    lines += terminal_table(gate_section(document))
    if any(d["rounds"] > 1 for d in speed["gate"]):
        lines += wrap("(a verdict's k/n: k of n independent measurement rounds flagged a regression; most must)")
    uncovered = sum(1 for m in speed["measurements"]
                    if not any(d["impl"] == m["impl"] and d["mode"] == m["mode"] and d["case"] == m["case"]
                               for d in speed["gate"]))
    if uncovered:
        lines += wrap(f"NOT GATED: {uncovered} timed case(s) have no baseline entry")
    return lines


def _ab_verdict(entry: dict[str, Any]) -> str:
    verdict = entry["verdict"]
    verdict = verdict.upper() if verdict == GateVerdict.REGRESSION else verdict
    kind = entry.get("sync_kind")
    if kind == SyncKind.BOTH:
        verdict = f"{verdict} (syncs: {100 * entry['threshold']:.0f}%)"
    elif kind == SyncKind.NEW_ONLY:
        verdict = f"{verdict} (new sync)"
    return verdict


def ab_section(entries: list[dict[str, Any]]) -> Section:
    """The A/B verdicts, one row per case: old and new medians, the paired ratio, its interval, the
    pairs, p and the verdict (a case not compared: dashes, and in Markdown why)."""
    section = Section([Column("implementation", "implementation"), Column("mode", "mode"), Column("case", "case"),
                       Column("old ms", "old ms", right=True), Column(None, "new ms"),
                       Column("new/old", "new/old", right=True), Column("99% interval", "99% interval", right=True),
                       Column(None, "pairs"), Column(None, "p slower"), Column("verdict", "verdict")])
    for e in entries:
        mode = Cell(_MODES.get(e["mode"], e["mode"]), e["mode"])
        if e["verdict"] == GateVerdict.NOT_COMPARED:
            section.add(e["impl"], mode, e["case"], *["-"] * 6,
                        Cell(GateVerdict.NOT_COMPARED.value, f"not compared: {e.get('problem') or ''}"))
            continue
        section.add(e["impl"], mode, e["case"], f"{e['old_median_ms']:.4f}", f"{e['new_median_ms']:.4f}",
                    f"{e['ratio']:.3f}", f"{e['low']:.3f}-{e['high']:.3f}", str(e["pairs"]), f"{e['p_slower']:.2g}",
                    Cell(_ab_verdict(e), str(e["verdict"])))
    return section


def ab_lines(document: dict[str, Any]) -> list[str]:
    """The A/B table of --attnkit-against: per case, the paired ratio new/old, its interval, the verdict."""
    against = document.get("against")
    if not against:
        return []
    lines = wrap(f"against {against['description']}: each case timed in both versions' workers in alternating "
                 "blocks; a regression needs a one-sided Wilcoxon signed-rank p < 0.01 on the pairs and the "
                 "practical threshold", "  ")
    entries = sorted(document.get("ab", []), key=lambda e: (e["impl"], e["mode"], e["case"]))
    if not entries:
        return lines + wrap("NOTHING GATED against it: no speed case was timed in both versions")
    pairs = sorted({e["pairs"] for e in entries if e["verdict"] != GateVerdict.NOT_COMPARED})
    if pairs:
        lines += wrap(f"  {pairs[0]}{'' if len(pairs) == 1 else f' to {pairs[-1]}'} pairs of blocks per case; "
                      "interval: seeded bootstrap of the median ratio new/old", "  ")
    lines += terminal_table(ab_section(entries))
    for e in entries:
        if e.get("problem"):
            lines += wrap(f"not compared: {e['impl']} {e['mode']} {e['case']}: {e['problem']}", "  ")
        elif e.get("syncs"):
            lines += wrap(f"syncs: {e['impl']} {e['mode']} {e['case']}: {e['syncs']} (a syncing call's time "
                          "follows its process's host speed, which pairing cannot cancel)", "  ")
    return lines


#: The out-of-memory failures the time table lists (the report keeps them all).
OUT_OF_MEMORY_SHOWN = 8

#: The order of the time table's rows: the suites in the order of --attnkit-suite's list, each suite's
#: warm-ups (compiled ahead) before the suite.
_TIME_ORDER = ("correctness", "memory (warm)", "memory", "speed (warm)", "speed", "properties", "sanitize")


def time_lines(document: dict[str, Any]) -> list[str]:
    """Where the run's time went (:mod:`pytest_attnkit.controller.ledger`): per suite and
    implementation, the requests, the seconds workers were busy with them, of which compiling,
    and the wall-clock span from the first to the last."""
    time = document.get("time") or {}
    rows = [row for row in time.get("rows", []) if row["requests"]]
    if not rows:
        return []
    at_once = f"up to {time['most_at_once']} requests at once" + (
        f" over {time['xdist_workers']} pytest-xdist workers" if time.get("xdist_workers") else "")
    lines = wrap(f"{time.get('wall_s', 0):.0f} s in this pytest process; {at_once}; busy seconds add up across "
                 "workers that ran at the same time", "  ")
    lines.append(f"{'suite':<14} {'implementation':<22} {'requests':>8} {'busy s':>9} {'compile s':>10} {'span s':>8}")
    order = {suite: index for index, suite in enumerate(_TIME_ORDER)}
    for row in sorted(rows, key=lambda row: (order.get(row["suite"], len(order)), row["suite"], row["impl"])):
        lines.append(f"{row['suite']:<14} {row['impl'][:22]:<22} {row['requests']:>8} {row['busy_s']:>9.1f} "
                     f"{row['compile_s']:>10.1f} {row['span_s']:>8.1f}")
    busy = sum(row["busy_s"] for row in rows)
    compiled = sum(row["compile_s"] for row in rows)
    startup = sum((time.get("startup_s") or {}).values())
    lines += wrap(f"in all: workers busy {busy:.0f} s, of which compiling {compiled:.0f} s; workers started in "
                  f"{startup:.0f} s; the pytest thread waited {time.get('waited_s', 0):.0f} s for results", "  ")
    line = None if time.get("xdist_workers") else timeline_line(time.get("events") or [], time.get("marks"))
    if line:  # under pytest-xdist each process counts from its own start: no one timeline
        lines += wrap(line, "  ")
    retried = time.get("retried_alone") or {}
    if retried:
        lines += wrap("ran again alone after running out of device memory beside other requests (the second "
                      "reply counts): " + ", ".join(f"{impl} {count}" for impl, count in retried.items()), "  ")
    cleared = time.get("retried_cleared") or {}
    if cleared:
        lines += wrap(f"ran again after running out of device memory alone, {time.get('stopped_workers', 0)} other "
                      "worker(s) stopped first to hand back their memory (the last reply counts): "
                      + ", ".join(f"{impl} {count}" for impl, count in cleared.items()), "  ")
    failures = time.get("out_of_memory") or []
    if failures:
        lines.append(f"the out-of-memory failures that sent them again ({len(failures)}):")
        for entry in failures[:OUT_OF_MEMORY_SHOWN]:
            lines += wrap("  " + out_of_memory_line(entry), "    ")
        if len(failures) > OUT_OF_MEMORY_SHOWN:
            lines.append(f"  and {len(failures) - OUT_OF_MEMORY_SHOWN} more (the report's time.out_of_memory)")
    return lines


def summary_sections(document: dict[str, Any], *, verbose: bool = False) -> list[tuple[str, list[str]]]:
    against = document.get("against")
    return [
        ("attnkit summary: each implementation", headline_lines(document)),
        ("attnkit memory scaling (peak extra device memory per call)", memory_lines(document)),
        ("attnkit speed", speed_lines(document, verbose=verbose) + ([""] if document["speed"]["measurements"] else [])
         + gate_lines(document) + [line for note in document["speed"]["notes"] for line in wrap(note)]),
        (f"attnkit A/B against {against['given'] if against else ''}", ab_lines(document)),
        ("attnkit time: where it went", time_lines(document)),
    ]


# -- Markdown ---------------------------------------------------------------------------------


def markdown(document: dict[str, Any]) -> str:
    env = document["environment"]
    out = ["# pytest-attnkit report", ""]
    if document["interrupted"]:
        out += ["**The run was interrupted: this report holds what was gathered until then.**", ""]
    out += [f"Device: {document['device']} ({env.get('device_name')}); torch {env.get('torch')}, triton {env.get('triton')}, "
            f"cupy {env.get('cupy')}; profile {document['profile']}.", ""]
    names = list(document["implementations"])
    installed = verdict_suites(document)  # sanitize, when it ran, and the installed suites
    if names:
        out += ["| implementation | correctness | memory exponent | speed (forward, d128) | gate |"
                + "".join(f" {suite} |" for suite in installed), "|---|---|---|---|---|" + "---|" * len(installed)]
        for name in names:
            memory = ", ".join(f"{s['direction']} {memory_figure(s)}" for s in document["memory"] if s["impl"] == name)
            out.append(f"| {name} | {correctness_verdict(document, name)} | {memory or '-'} | "
                       f"{speed_headline(document, name)} | {gate_headline(document, name)} |"
                       + "".join(f" {correctness_verdict(document, name, suite)} |" for suite in installed))
        out.append("")
    speed = document["speed"]
    if speed["ceilings"]:
        out += [f"Ceilings measured in this run: bf16 matmul {speed['ceilings']['matmul_bf16_tflops']:.0f} TFLOP/s, "
                f"device copy {speed['ceilings']['copy_gbps']:.0f} GB/s.", ""]
    if speed["measurements"]:
        out += ["## Speed", "", *markdown_table(speed_section(document))]
        out.append("")
        out += ["## Gate", ""]
        if not speed["gate"]:
            out += [" ".join(gate_lines(document))]
        else:
            counts = speed.get("machine_factor_cases")
            over = (f" (over {counts[0]} of the reference's {counts[1]} cases: those that synchronize or whose "
                    "saved runs disagree are left out)" if counts and counts[0] < counts[1] else "")
            out += [f"Against {speed.get('baseline_file')}; machine factor {speed['machine_factor']:.3f}{over}.", "",
                    *markdown_table(gate_section(document))]
        out.append("")
    if document.get("against"):
        out += [f"## A/B against {document['against']['given']}", "",
                f"Against {document['against']['description']}: paired, interleaved blocks; "
                "one-sided Wilcoxon signed-rank p < 0.01 and the threshold.", "",
                *markdown_table(ab_section(sorted(document.get("ab", []),
                                                  key=lambda e: (e["impl"], e["mode"], e["case"]))))]
        out.append("")
    if document["memory"]:
        out += ["## Memory", ""]
        for sweep in document["memory"]:
            slope = "none (no extra memory)" if sweep["slope"] is None else f"{sweep['slope']:.2f}"
            out += [f"**{sweep['impl']}** ({sweep['direction']}, declared {sweep['declared']}): fitted exponent {slope}, "
                    f"{sweep['verdict']}; largest N that fit {sweep['largest_n']}", "",
                    *markdown_table(memory_section(sweep["points"], sweep["verdict"]))]
            out.append("")
    failures = [test for test in document["tests"] if test["outcome"] == Verdict.FAILED]
    if failures:
        out += ["## Failures", ""]
        out += [f"- `{test['test']}`: {test['message'].splitlines()[0] if test['message'] else ''}" for test in failures[:200]]
        out.append("")
    if document.get("plots_skipped"):
        out += ["## Plots", "", f"Plots skipped: {document['plots_skipped']}.", ""]
    elif document.get("plots"):
        out += ["## Plots", ""] + [f"![{plot}]({plot})" for plot in document["plots"]] + [""]
    return "\n".join(out)
