"""Per-opcode totals of an Nsight Compute source page (``ncu -i REPORT --page source --csv
--print-source sass``): instructions executed, shared-memory wavefronts (and the ideal count, and
the excess that bank conflicts add) and the share of warp-stall samples, biggest first.

    python3 tools/flash_bench/ncu_sass_table.py results/.../gluon4k-sass.csv.gz [--top 14]
"""

import argparse
import csv
import gzip
import io


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def table(path: str, top: int) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as handle:
        rows = list(csv.reader(io.StringIO(handle.read())))
    kernel = rows[0][1] if rows and len(rows[0]) > 1 else "?"
    header = {name: index for index, name in enumerate(rows[1])}
    totals: dict[str, list[float]] = {}
    columns = ("Instructions Executed", "L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal",
               "L1 Wavefronts Shared Excessive", "Warp Stall Sampling (All Samples)")
    for row in rows[2:]:
        words = row[header["Source"]].split()
        if not words:
            continue
        opcode = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        sums = totals.setdefault(opcode, [0.0] * len(columns))
        for index, column in enumerate(columns):
            sums[index] += _number(row[header[column]])
    samples = sum(sums[4] for sums in totals.values()) or 1.0
    lines = [f"{kernel[:96]}", f"{'opcode':<28} {'executed':>12} {'shared wf':>12} {'ideal':>12} {'excess':>12} "
             f"{'stalls %':>8}"]
    for key in (1, 4):
        lines.append(f"-- by {'shared-memory wavefronts' if key == 1 else 'warp-stall samples'}")
        ranked = sorted(totals.items(), key=lambda item: -item[1][key])[:top]
        lines += [f"{opcode:<28} {sums[0]:>12,.0f} {sums[1]:>12,.0f} {sums[2]:>12,.0f} {sums[3]:>12,.0f} "
                  f"{100 * sums[4] / samples:>8.1f}" for opcode, sums in ranked if sums[key] > 0]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="+")
    parser.add_argument("--top", type=int, default=12)
    arguments = parser.parse_args()
    print("\n\n".join(table(path, arguments.top) for path in arguments.csv))
