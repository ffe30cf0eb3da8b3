#!/usr/bin/env python3
"""What a run compiled with Triton's JIT: kernels, how often, and which of their parameters made
the specializations differ. Reads the folder a run wrote with ``ATTNKIT_COMPILE_LOG=DIR``
(pytest_attnkit/worker/compile_clock.py); a kernel taken from the disk cache shows as a compile
of a few milliseconds.

    ATTNKIT_COMPILE_LOG=/tmp/census pytest --attnkit --attnkit-impl=triton_flash --attnkit-suite=correctness
    python3 tools/compile_census.py /tmp/census

Standard library only.
"""

from __future__ import annotations

import ast
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path


def _entries(text: str) -> dict[str, str]:
    """A repr'd dict of constexprs or specializations, as {name: value} strings (best effort)."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return {"?": text}
    if isinstance(value, dict):
        return {str(key): repr(item) for key, item in value.items()}
    return {"?": text}


def main(folder: str) -> int:
    lines = [json.loads(line) for path in Path(folder).glob("*.jsonl") for line in path.read_text().splitlines()]
    by_kernel: dict[str, list[dict]] = defaultdict(list)
    for line in lines:
        by_kernel[line["kernel"]].append(line)
    total = sum(line["seconds"] for line in lines)
    print(f"{len(lines)} compilations in {total:.1f} s over {len(list(Path(folder).glob('*.jsonl')))} processes")
    for kernel, compiles in sorted(by_kernel.items(), key=lambda item: -sum(c["seconds"] for c in item[1])):
        keys = {(c["constexprs"], c["specialization"]) for c in compiles}
        print(f"\n{kernel}: {len(compiles)} compilations, {len(keys)} distinct, "
              f"{sum(c['seconds'] for c in compiles):.1f} s")
        for field in ("constexprs", "specialization"):
            values: dict[str, Counter[str]] = defaultdict(Counter)
            for constexprs, specialization in keys:
                for name, value in _entries(constexprs if field == "constexprs" else specialization).items():
                    values[name][value] += 1
            varying = {name: counter for name, counter in values.items() if len(counter) > 1}
            for name, counter in sorted(varying.items(), key=lambda item: -len(item[1])):
                shown = ", ".join(f"{value} x{count}" for value, count in counter.most_common(6))
                print(f"  {field[:6]} {name}: {len(counter)} values ({shown})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
