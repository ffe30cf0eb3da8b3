"""Compile triton_flash's Gluon backward (``gluon_backward.py``) for sm_90a without a GPU, and say what came out.

The sibling of ``gluon_compile.py`` (the forward's): the same stand-in driver, ptxas ``-v`` and
SASS reading. For each configuration: registers at launch and each partition's ``setmaxnreg``,
spills, shared memory, the PTX's wgmma shapes, TMA loads, atomics (``red``/``atom`` on global
float32: the dQ adds) and barriers, and the SASS's HGMMA / UTMALDG / RED counts.

Usage: PYTHONPATH=. /tmp/v36/bin/python tools/flash_bench/gluon_bwd_compile.py [--quick] [--dump DIR] [--config m64s2 ...] [--causal] [--alibi] [--window]
(``--quick``: the default configuration of each head dim, bf16, causal and not; without it fp16
too and a few other tiles. ``--alibi``: the same kernels with ALiBi's bias, ``--window``: with a
sliding window (one kernel for causal and not), d64 and d128 only, queries as rows.)
Exit status 1 if any configuration fails to compile, spills, has its
products serialized (ptxas C7512), or does not fit in shared memory.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gluon_compile import (_hazards, _opcode, _sass, barrier_alias_words, compile_matrix, compile_parser,  # noqa: E402
                           config_matrix, ensure_package, ptx_counts, serialized, stand_in_target, value_dim)


def load_gluon_backward():
    ensure_package()
    return importlib.import_module("pytest_attnkit.implementations.triton_flash.gluon_backward")


def _loops(sass: list[tuple[int, str]]) -> list[list[str]]:
    """The innermost backward-branch loops that issue wgmma (HGMMA): the consumers' tile loops
    (the partitions' dispatch loop around everything, with USETMAXREG, left out)."""
    loops = []
    for address, instruction in sass:
        target = re.search(r"BRA (0x[0-9a-f]+)", instruction)
        if not target or int(target[1], 16) >= address:
            continue
        start = int(target[1], 16)
        body = [text for at, text in sass if start <= at <= address]
        inner = [at for at, text in sass if start <= at < address and (b := re.search(r"BRA (0x[0-9a-f]+)", text))
                 and start <= int(b[1], 16) < at]
        if inner or any(t.startswith("USETMAXREG") for t in body) or not any("HGMMA" in t for t in body):
            continue  # not innermost, the dispatch loop, or no product
        loops.append(body)
    return loops


def unbarriered_arrives(ptx: str) -> list[str]:
    """The plain mbarrier arrivals (not ``expect_tx``) that follow a shared-memory access with no
    ``bar.sync`` between, read in the PTX's order: Gluon's ``mbarrier.arrive`` is one thread's, so
    the other threads' stores (or loads) before it are ordered only by a barrier of the warp group
    first (``-pair``'s and ``-sum``'s handoffs; the protocol model, one coroutine a warp group,
    cannot see this). Triton 3.6's shared-memory barrier pass inserts that barrier itself (with the
    kernel's ``gl.thread_barrier()`` before ``-pair``'s arrival removed, the PTX still had a
    ``bar.sync`` there): this checks the compiled code keeps it. Each as ``gluon_backward.py:LINE``."""
    found, dirty, where = [], False, "?"
    for line in ptx.splitlines():
        text = line.strip()
        if text.startswith(".loc"):
            where = (text.split()[2:3] or ["?"])[0]
        elif re.match(r"(@!?%p\d+ )?((st|ld|red|atom)\.shared|stmatrix|ldmatrix)", text):
            dirty = True
        elif re.match(r"(bar|barrier)\.sync\b", text):
            dirty = False
        elif "mbarrier.arrive" in text and "expect_tx" not in text and dirty:
            found.append(f"gluon_backward.py:{where}")
    return found


def describe(compiled, shared_limit: int) -> tuple[str, bool]:
    ptx = compiled.asm["ptx"]
    regs, spills, warnings, dec, inc, wgmma, tma_loads = ptx_counts(ptx)
    atomics = sorted(set(re.findall(r"\b((?:red|atom)\.[\w.]*add[\w.]*)", ptx)))
    n_atomics = len(re.findall(r"\b(?:red|atom)\.[\w.]*add", ptx))
    bars = len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\b", ptx))
    sass = _sass(compiled.asm["cubin"])
    ops = [_opcode(text) for _, text in sass]
    hgmma = sum(op.startswith("HGMMA") for op in ops)
    utmaldg = sum(op.startswith("UTMALDG") for op in ops)
    red = sum(op.startswith(("RED", "ATOM")) for op in ops)
    loops = _loops(sass)
    hazards = [text for body in loops for text in _hazards(body)]
    local = [sum(op.startswith(("LDL", "STL")) for op in map(_opcode, body)) for body in loops]
    unordered = unbarriered_arrives(ptx)
    shared = compiled.metadata.shared
    fits = shared <= shared_limit
    line = (f"regs {regs} at launch, setmaxnreg dec {dec} inc {inc}; spills {spills} B; shared {shared} B"
            f"{'' if fits else ' (OVER THE LIMIT)'}; PTX wgmma {wgmma}, TMA loads {tma_loads}, "
            f"float adds {n_atomics} {atomics}, bar.sync {bars}; SASS HGMMA {hgmma}, UTMALDG {utmaldg}, RED/ATOM {red}; "
            f"{len(loops)} tile loops, {max((len(b) for b in loops), default=0)} instrs the longest, "
            f"local-memory (spill) instrs in them {local}, {len(hazards)} touches of in-flight wgmma registers")
    if hazards:
        line += " (" + "; ".join(hazards[:4]) + ")"
    line += f"; {len(unordered)} arrivals after shared accesses with no barrier between"
    if unordered:
        line += " (" + ", ".join(sorted(set(unordered))) + ")"
    words, no_aliases = barrier_alias_words(ptx)
    line += words
    serial = serialized(warnings)
    line += serial
    if warnings:
        line += "; ptxas: " + " | ".join(warnings)
    return line, (spills == 0 and fits and regs > 0 and not hazards and not unordered and no_aliases
                  and not serial)


def main() -> int:
    args = compile_parser(__doc__, "m64s3, m128s2-r232").parse_args()
    gb, torch = stand_in_target(load_gluon_backward)
    if gb is None:
        return 1
    extra = [] if args.quick else ["m64s2", "m64s3", "m128s2", "m64s2-split", "m64s2-q128", "m64s2-krows",
                                     "m64s2-rot", "m64s2-sum", "m64s2-tmar"]
    matrix = config_matrix(gb, args.quick, extra + args.config, args.causal)
    # MLA (Q's and K's head dim above V's): its default, causal and not, in each dtype.
    dtypes = (torch.bfloat16,) if args.quick else (torch.bfloat16, torch.float16)
    matrix += [(head_dim, causal, dtype, gb.default_config(head_dim, causal))
               for head_dim, head_dim_v in gb.HEAD_DIM_PAIRS if head_dim_v != head_dim
               for causal in (False, True) for dtype in dtypes]

    if args.alibi or args.window:
        # ALiBi and windows are written for d64 and d128 with queries as rows, windows walked in
        # order (launch_arguments refuses the rest).
        matrix = [entry for entry in matrix if value_dim(gb, entry[0]) == entry[0] and entry[3].qrows
                  and not (args.window and entry[3].rotate)]

    def warm(head_dim, causal, dtype, config):
        q = torch.empty(1, 4, 1000, head_dim, dtype=dtype)
        k = torch.empty(1, 2, 900, head_dim, dtype=dtype)  # GQA and Nq != Nk: one kernel serves all
        v = torch.empty(1, 2, 900, value_dim(gb, head_dim), dtype=dtype)
        window = ((256, 0) if causal else (256, 100)) if args.window else None
        return gb.warmup(q, k, v, causal, head_dim ** -0.5, config, alibi=args.alibi, window=window)

    prefix = "bwd " + "alibi " * args.alibi + "window " * args.window
    failures, spilled = compile_matrix(gb, matrix, prefix, warm, describe, args.dump, 3000)
    print("OK" if failures == 0 else f"{failures} configuration(s) failed, spilled or did not fit"
          + (f" ({len(spilled)} spilled: {', '.join(spilled)})" if spilled else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
