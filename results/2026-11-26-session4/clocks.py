"""Issue 41's "slower clock" on the H100 data of 2026-11-26 (run from the repository root).

replay: the three speed cases the save runs h100-save2 and h100-save3 flagged as regressions,
re-decided with pytest_attnkit.controller.gate.explained_by_clock: the clock each case's samples
ran at (the report's timing.clock_mhz_median) against the median clock of the runs saved before
it in this session (h100-save1, h100-save2: the committed baselines' runs have no clock).

backfill SAVED CUPY OUT: the H100 baseline file these runs saved (h100-save3's, with the
full-profile save of cupy_naive's four 16k entries from another process), each saved run of this
session given the clock_mhz its report measured, less the runs the replay excuses (as a save of
today's code leaves them out); a run is matched by its median, which the file and the report
both hold to the bit, and by its date (saved after the first save began).
"""

import lzma
import json
import sys
from pathlib import Path

from pytest_attnkit.controller.gate import Decision, GateVerdict, at_equal_clocks, explained_by_clock

HERE = Path(__file__).parent
SAVES = ["h100-save1", "h100-save2", "h100-save3"]
#: Only runs saved by these runs get a clock: cuda-event medians are quantized, so an older run's
#: median can equal one of these to the bit.
SESSION_START = "2026-11-26T11:14"


def report(label: str) -> dict:
    return json.loads(lzma.decompress((HERE / "h100" / label / "attnkit-report.json.xz").read_bytes()))  # gzip until 2026-11-29


def measurements(label: str) -> dict:
    return {(m["impl"], m["mode"], m["case"]): m["timing"] for m in report(label)["speed"]["measurements"]}


def replay() -> list[tuple[str, tuple[str, str, str]]]:
    """Prints each flagged case's verdict re-decided; returns the (save, key) the clock excused."""
    seen = {label: measurements(label) for label in SAVES}
    excused = []
    for index, label in enumerate(SAVES):
        for gate in report(label)["speed"]["gate"]:
            if gate["verdict"] != GateVerdict.REGRESSION:
                continue
            key = (gate["impl"], gate["mode"], gate["case"])
            clocks = sorted(seen[earlier][key]["clock_mhz_median"] for earlier in SAVES[:index])
            baseline_clock = (clocks[(len(clocks) - 1) // 2] + clocks[len(clocks) // 2]) / 2
            fields = {name: gate[name] for name in Decision.__dataclass_fields__ if name in gate}
            decision = explained_by_clock(Decision(**{**fields, "verdict": GateVerdict(gate["verdict"])}),
                                          seen[label][key]["clock_mhz_median"], baseline_clock)
            at_equal = at_equal_clocks(decision)
            print(f"{label}: {' '.join(key)}: {100 * (gate['ratio'] - 1):+.1f}% at {decision.clock_mhz:.0f} MHz "
                  f"against {decision.baseline_clock_mhz:.0f} MHz (earlier saves {', '.join(f'{c:.0f}' for c in clocks)});"
                  f" at equal clocks {100 * (at_equal - 1):+.1f}%, threshold {100 * gate['threshold']:.1f}%: "
                  f"{gate['verdict']} -> {decision.verdict}")
            if decision.verdict == GateVerdict.SLOWER_CLOCK:
                excused.append((label, key))
    return excused


def backfill(saved: Path, cupy: Path, out: Path) -> None:
    document = json.loads(saved.read_text())
    for name, entry in json.loads(cupy.read_text())["entries"].items():
        if entry["impl"] == "cupy_naive" and "q16384" in entry["case"]:
            document["entries"][name] = entry
    medians = {}
    for label in SAVES:
        for key, timing in measurements(label).items():
            medians[(key, timing["median_ms"])] = timing["clock_mhz_median"]
    filled = 0
    for entry in document["entries"].values():
        key = (entry["impl"], entry["mode"], entry["case"])
        for run in entry["history"]:
            clock = medians.get((key, run["median_ms"]))
            if clock and "clock_mhz" not in run and run.get("date", "") >= SESSION_START:
                run["clock_mhz"] = round(clock, 1)
                filled += 1
    # Today's code leaves out of a save the runs its gate calls "slower clock" (the entry keeps its
    # earlier runs and its latest run's fields): do the same for the runs the replay excuses.
    for label, key in replay():
        entry = document["entries"]["::".join(key)]
        timing = measurements(label)[key]
        entry["history"] = [run for run in entry["history"] if run["median_ms"] != timing["median_ms"]]
        if entry["median_ms"] == timing["median_ms"]:  # it was the latest run: the one before is
            before = SAVES[SAVES.index(label) - 1]
            m = next(m for m in report(before)["speed"]["measurements"] if (m["impl"], m["mode"], m["case"]) == key)
            entry.update(median_ms=m["timing"]["median_ms"], iqr_ms=m["timing"]["iqr_ms"],
                         samples=len(m["timing"]["samples_ms"]), samples_ms=m["timing"]["samples_ms"],
                         tflops=m["tflops"], gbps=m["gbps"], ratio_to_reference=m["ratio_to_reference"],
                         gpu_state=m["gpu_state"], date=entry["history"][-1]["date"])
        print(f"  left out of {' '.join(key)}: the run of {label}")
    out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"{out}: {len(document['entries'])} entries, {filled} saved runs given their clock")


if __name__ == "__main__":
    if sys.argv[1] == "replay":
        replay()
    else:
        backfill(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
