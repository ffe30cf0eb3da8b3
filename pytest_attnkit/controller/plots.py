"""The report's plots, drawn with matplotlib (imported only when a report is written).

Each figure is meant for a reader who never saw the tool: titled with what it shows, axes with
units, the machine's measured ceilings drawn in, one colour per implementation throughout.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

from pytest_attnkit.contract import Case
from pytest_attnkit.records import PointStatus

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_COLOURS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _colour(names: list[str], name: str) -> str:
    return _COLOURS[sorted(names).index(name) % len(_COLOURS)]


def _on_length_axis(case: Case) -> bool:
    """A plain prefill case: query and key lengths equal, no variant that changes the work."""
    return (case.kind == "dense" and case.seqlen_q == case.seqlen_k >= 2 and not case.variants and case.head_dim_v is None
            and case.layout == "bhsd" and case.logit_scale == 1.0)


def _tokens(count: int) -> str:
    return f"{count // 1024}k" if count >= 1024 and count % 1024 == 0 else str(count)


def length_axis_label(cases: list[Case]) -> str:
    """What the sequence-length axis holds, as the plotted cases say: "batch x length = 16k" only
    when every point on it has batch x length = 16k."""
    batches = sorted({case.batch for case in cases})
    tokens = {case.batch * case.seqlen_q for case in cases}
    if len(batches) > 1 and len(tokens) == 1:
        return f"sequence length (tokens; batch x length = {_tokens(tokens.pop())})"
    if len(batches) == 1:
        return f"sequence length (tokens; batch {batches[0]})"
    return f"sequence length (tokens; batch {', '.join(map(str, batches))})"


def speed_panels(document: dict[str, Any], mode: str) -> list[dict[str, Any]]:
    """One panel per (head dim, causal): each implementation's (length, TFLOP/s) points, read from
    the measurements' structured ``shape``, and the label that their cases make true."""
    panels: dict[tuple[int, bool], dict[str, Any]] = {}
    for m in document["speed"]["measurements"]:
        case = Case.from_dict(m["shape"])
        if m["mode"] != mode or not _on_length_axis(case):
            continue  # decode, mismatched lengths and variants are not on a sequence-length axis
        panel = panels.setdefault((case.head_dim, case.causal), {"head_dim": case.head_dim, "causal": case.causal,
                                                                  "cases": [], "series": defaultdict(list)})
        panel["cases"].append(case)
        panel["series"][m["impl"]].append((case.seqlen_q, m["tflops"]))
    for panel in panels.values():
        panel["xlabel"] = length_axis_label(panel["cases"])
        for points in panel["series"].values():
            points.sort()
    return [panels[key] for key in sorted(panels)]


def draw_speed(document: dict[str, Any], mode: str, path: Path) -> bool:
    panels = speed_panels(document, mode)
    if not panels:
        return False
    names = sorted({m["impl"] for m in document["speed"]["measurements"]})
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2), squeeze=False, sharey=True)
    ceiling = document["speed"]["ceilings"].get("matmul_bf16_tflops")
    for axis, panel in zip(axes[0], panels):
        for name, points in sorted(panel["series"].items()):
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name, color=_colour(names, name))
        if ceiling:
            axis.axhline(ceiling, color="grey", linestyle="--", linewidth=1, label=f"bf16 matmul, measured ({ceiling:.0f})")
        axis.set_xscale("log", base=2)
        axis.set_ylim(bottom=0)  # a bar of zero keeps the gaps between implementations honest
        axis.set_title(f"head dim {panel['head_dim']}, {'causal' if panel['causal'] else 'not causal'}")
        axis.set_xlabel(panel["xlabel"])
        axis.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("TFLOP/s (FlashAttention's FLOP count)")
    axes[0][-1].legend(fontsize=8, loc="best")
    figure.suptitle(f"{mode} speed on {document['environment'].get('device_name')} (higher is better)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def draw_memory(document: dict[str, Any], path: Path) -> bool:
    if not document["memory"]:
        return False
    names = sorted({sweep["impl"] for sweep in document["memory"]})
    figure, axis = plt.subplots(figsize=(7.5, 5))
    for sweep in document["memory"]:
        points = [(p["seqlen"], p["extra_bytes"]) for p in sweep["points"]
                  if p["status"] == PointStatus.MEASURED and p["extra_bytes"] > 0]
        if not points:
            continue
        slope = "flat" if sweep["slope"] is None else f"N^{sweep['slope']:.2f}"
        style = "-" if sweep["direction"] == "forward" else "--"
        axis.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", color=_colour(names, sweep["impl"]),
                  label=f"{sweep['impl']} {sweep['direction']}: {slope} (declared {sweep['declared']})")
        stopped = [p for p in sweep["points"] if p["status"] == PointStatus.OOM]
        if stopped:
            axis.annotate(f"out of memory at N={stopped[0]['seqlen']}", (points[-1][0], points[-1][1]),
                          textcoords="offset points", xytext=(-120, 8), fontsize=8)
    axis.set_xscale("log", base=2)
    axis.set_yscale("log", base=2)
    axis.set_xlabel("sequence length N (tokens)")
    axis.set_ylabel("peak extra device memory per call (bytes)")
    sweep = document["memory"][0]["sweep"]
    axis.set_title(f"Memory growth (B={sweep['batch']}, H={sweep['heads']}, D={sweep['head_dim']}, {sweep['dtype']}): "
                   "slope 2 = quadratic, 1 = linear", fontsize=10)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def draw_roofline(document: dict[str, Any], path: Path) -> bool:
    ceilings = document["speed"]["ceilings"]
    measurements = [m for m in document["speed"]["measurements"] if m["bytes"] > 0 and m["tflops"] > 0]
    if not ceilings or not measurements:
        return False
    names = sorted({m["impl"] for m in measurements})
    peak, bandwidth = ceilings["matmul_bf16_tflops"], ceilings["copy_gbps"] / 1e3  # TB/s
    intensities = [m["flops"] / m["bytes"] for m in measurements]
    low, high = min(intensities) / 2, max(intensities) * 2
    xs = [low * (high / low) ** (i / 200) for i in range(201)]
    figure, axis = plt.subplots(figsize=(7.5, 5))
    axis.plot(xs, [min(peak, bandwidth * x) for x in xs], color="black", linewidth=1.5,
              label=f"roof: {peak:.0f} TFLOP/s matmul, {ceilings['copy_gbps']:.0f} GB/s copy (measured)")
    for m, intensity in zip(measurements, intensities):
        axis.scatter(intensity, m["tflops"], color=_colour(names, m["impl"]), marker="o" if m["mode"] == "forward" else "^", s=22)
    for name in names:
        axis.scatter([], [], color=_colour(names, name), label=name)
    axis.scatter([], [], color="grey", marker="o", label="forward")
    axis.scatter([], [], color="grey", marker="^", label="backward")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("arithmetic intensity (FLOP per byte of minimal traffic)")
    axis.set_ylabel("TFLOP/s")
    axis.set_title("Roofline: decode sits on the bandwidth slope, long prefill under the compute roof", fontsize=10)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7, loc="upper left")  # the empty corner: above the bandwidth slope
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def draw_all(document: dict[str, Any], directory: Path) -> list[str]:
    written = []
    for name, draw in (("speed-forward.png", lambda p: draw_speed(document, "forward", p)),
                       ("speed-backward.png", lambda p: draw_speed(document, "backward", p)),
                       ("memory.png", lambda p: draw_memory(document, p)),
                       ("roofline.png", lambda p: draw_roofline(document, p))):
        if draw(directory / name):
            written.append(name)
    return written
