"""Drop the runs of triton_flash's old forward program from the baseline entries of the cases the
Gluon forward took over on Hopper (e2d62a8), where three runs of the new program are saved.

Why: the runs saved before 2026-11-26 timed the Triton kernels (20-30% slower on these cases)
and recorded no program, so the gate pooled them with the three Gluon runs: on the H200 the
16k d128 entry's baseline read 4.27 ms for a 3.14 ms kernel with a 66% threshold, blind to a
Gluon slowdown of up to 2x (found in review, 2026-11-26). The gate restarts an entry's history
only on a change beyond its noise, which these were not for every entry.

Usage, from the repository root: python3 results/2026-11-26-gpus/prune_old_program_runs.py
"""

import json
import re
from pathlib import Path

#: What gluon_forward.unsupported_reason takes: dense fp16/bf16, d64 or d128, plain or causal, not decode.
GLUON_CASE = re.compile(r"^b\d+-h\d+(?::\d+)?-q(\d+)-k\d+-d(?:64|128)-(?:bf16|fp16)(?:-causal)?$")
SINCE = "2026-11-26"

for path in sorted(Path("baselines").glob("*.json")):
    document = json.loads(path.read_text())
    for name, entry in document["entries"].items():
        impl, mode, case = name.split("::", 2)
        match = GLUON_CASE.match(case)
        if impl != "triton_flash" or mode != "forward" or not match or int(match.group(1)) <= 1:
            continue
        runs = entry["history"]
        kept = [run for run in runs if run["date"] >= SINCE]
        if len(kept) >= 3 and len(kept) < len(runs):
            print(f"{path.name}: {case}: {len(runs)} runs -> {len(kept)}")
            entry["history"] = kept
    path.write_text(json.dumps(document, indent=1) + "\n")
