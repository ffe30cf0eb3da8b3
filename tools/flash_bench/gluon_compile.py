"""Compile triton_flash's Gluon forward for sm_90a without a GPU, and say what came out.

A stand-in driver (``sm90_compile._TargetOnly``) answers Triton's questions about the device, so
``warmup`` compiles the kernel exactly as ``gluon_forward.flash_fwd`` would launch it
(``gluon_forward.warmup``). For each configuration it reports:

- registers: the launch count (ptxas) and each partition's ``setmaxnreg`` (the producer's
  decrease, the consumers' increase), spills (ptxas ``-v`` and its warnings), whether ptxas
  serialized the wgmma products for want of registers (its info C7512: ``serialized``), shared
  memory;
- instructions: the PTX's ``wgmma.mma_async`` shapes and TMA (``cp.async.bulk.tensor``) loads and
  stores; in the SASS, HGMMA, UTMALDG/UTMASTG, and the consumer's whole-tile loop: its length
  and how much of the softmax (MUFU.EX2) ptxas left to run while the warp group's own PV product
  is in flight (FlashAttention-3's overlap inside a warp group).

Usage: python3 tools/flash_bench/gluon_compile.py [--quick] [--dump DIR] [--config n128s2 ...] [--causal]
[--alibi] [--window] [--softcap] [--sinks] [--fp8] (``--quick``: the default configurations, bf16, causal
and not; ``--config`` adds others; ``--window``, ``--softcap``, ``--sinks``: every kernel with that
variant, in the one-item grid; ``--fp8``: the FP8 kernel, e4m3, at each head dim, causal and not, in its configuration and each
``--config``.)
Exit status 1 if any configuration fails to compile, spills, has its products serialized, or does not fit
in shared memory.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODULE_PATH = REPO / "implementations" / "triton_flash" / "gluon_forward.py"


def ensure_package() -> None:
    """Make ``pytest_attnkit.implementations.triton_flash`` importable from this checkout when the
    project is not installed (setuptools maps ``implementations/`` there; a GPU machine without
    ``pip install -e .`` has only the folders)."""
    import types

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    try:
        importlib.import_module("pytest_attnkit.implementations.triton_flash")
        return
    except ImportError:
        pass
    import pytest_attnkit

    package = types.ModuleType("pytest_attnkit.implementations")
    package.__path__ = [str(REPO / "implementations")]
    sys.modules["pytest_attnkit.implementations"] = package
    pytest_attnkit.implementations = package


def load_gluon_forward():
    """``gluon_forward`` as the package's module (installed, or this checkout through
    :func:`ensure_package`); by path if the package does not import here (it needs only torch and
    triton)."""
    try:
        ensure_package()
        return importlib.import_module("pytest_attnkit.implementations.triton_flash.gluon_forward")
    except ImportError:
        pass
    name = "attnkit_gluon_forward"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, MODULE_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and Triton's source lookup need it registered
    spec.loader.exec_module(module)
    return module


def _tool(name: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def _ptxas() -> str:
    """The ptxas Triton itself runs for sm_90a: the bundled ``ptxas`` in triton 3.6, the newer
    ``ptxas-blackwell`` in 3.9, whose PTX (.version 9.4) the older one refuses."""
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(90).path


def _ptxas_report(ptx: str) -> tuple[int, int, list[str]]:
    """(registers, spilled bytes stored + loaded, warnings) from ptxas -v on the kernel's PTX."""
    with tempfile.TemporaryDirectory() as folder:
        source, target = Path(folder) / "k.ptx", Path(folder) / "k.cubin"
        source.write_text(ptx)
        run = subprocess.run([_ptxas(), "-v", "--warn-on-spills", "-arch=sm_90a", str(source), "-o",
                              str(target)], capture_output=True, text=True)
    text = run.stdout + run.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", text))
    # Its warnings, and its infos on a performance loss (C7512: serialized products, below).
    warnings = [line.strip() for line in text.splitlines()
                if "warning" in line.lower() or "Performance Loss" in line]
    return (int(regs[1]) if regs else -1), spills, warnings


def serialized(warnings: list[str]) -> str:
    """What to add to a kernel's line when ptxas serialized its wgmma products for want of
    registers (its info C7512: a wait after each product, none in flight beside another), else
    "". It says so only in an info line, which is not a warning: the MLA backward was compiled so
    until NOTES.md v29, 5.4 KiB of spills its only visible sign, and ran at 0.61x cuDNN (0.73x
    once it was not)."""
    if any("C7512" in line or "mma_async instructions are serialized" in line for line in warnings):
        return "; WGMMA SERIALIZED (ptxas C7512: every product waited for)"
    return ""


def _sass(cubin: bytes) -> list[tuple[int, str]]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        text = subprocess.run([_tool("cuobjdump"), "-sass", handle.name], capture_output=True, text=True).stdout
    found = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)
    return [(int(address, 16), instruction.strip()) for address, instruction in found]


def _opcode(instruction: str) -> str:
    words = instruction.split()
    return words[1] if words and words[0].startswith("@") else (words[0] if words else "")


def _product_loops(sass: list[tuple[int, str]]) -> list[list[str]]:
    """The consumer loops that issue both products (QK^T from shared memory with no accumulator,
    PV with P from registers), in address order: per consumer, the whole-tile loop comes first,
    then the masked one."""
    loops = []
    for address, instruction in sass:
        target = re.search(r"BRA (0x[0-9a-f]+)", instruction)
        if not target or int(target[1], 16) >= address:
            continue
        body = [text for at, text in sass if int(target[1], 16) <= at <= address]
        if any(t.startswith("USETMAXREG") for t in body):
            continue  # the partitions' dispatch loop, around everything
        if any("!UPT" in t and "HGMMA" in t for t in body) and any("tnspB" in t for t in body):
            loops.append(body)
    return loops


def _overlap(body: list[str]) -> tuple[int, int]:
    """(MUFU issued while a PV product is in flight, MUFU in the loop): how much of the softmax's
    exp2 ptxas left under this warp group's own PV product. The body is replayed twice, so the
    second pass starts with what the loop carries in flight; a run of HGMMA ending in ``gsb0`` is
    one group (PV: P from registers, ``tnspB``), ``WARPGROUP.DEPBAR.LE gsb0, n`` retires all but
    the newest n."""
    total = sum(_opcode(t).startswith("MUFU") for t in body)
    in_flight: list[bool] = []  # one entry per group, oldest first: is it a PV product?
    group_is_pv = False
    under = 0
    for replay in range(2):
        for text in body:
            op = _opcode(text)
            if op.startswith("HGMMA"):
                group_is_pv = group_is_pv or "tnspB" in text
                if "gsb0" in text:
                    in_flight.append(group_is_pv)
                    group_is_pv = False
            elif text.startswith("WARPGROUP.DEPBAR.LE"):
                keep = int(text.rsplit(",", 1)[1].strip(), 16)
                in_flight = in_flight[len(in_flight) - keep:] if keep else []
            elif op.startswith("MUFU") and replay == 1 and any(in_flight):
                under += 1
    return under, total


_NO_DESTINATION = ("ST", "BAR", "BRA", "SYNCS", "WARPGROUP", "DEPBAR", "RED", "ATOM", "UTMA", "EXIT", "RET",
                   "MEMBAR", "FENCE", "NOP", "CALL", "ELECT", "ISETP", "FSETP", "PLOP3", "VOTEU", "UISETP")


def _registers(operand: str, count: int) -> set[int]:
    found = re.match(r"-?\|?R(\d+)", operand.strip())
    return set(range(int(found[1]), int(found[1]) + count)) if found else set()


def _hazards(body: list[str]) -> list[str]:
    """Instructions that write a register an in-flight wgmma group reads (its A fragment or its
    accumulator) or read an in-flight accumulator, before the ``WARPGROUP.DEPBAR`` that retires it:
    undefined behaviour in PTX's terms, whoever put it there. The body is replayed twice (what the
    loop carries in flight). SASS operands are parsed simply: the first operand is the destination
    of an ALU instruction, a ``.64``/``.128`` access covers 2/4 registers."""
    groups: list[tuple[set[int], set[int]]] = []  # per in-flight group: (A registers, accumulator)
    a_regs: set[int] = set()
    acc_regs: set[int] = set()
    found = []
    for replay in range(2):
        for text in body:
            op = _opcode(text)
            words = text.split(None, 2 if text.startswith("@") else 1)
            operands = [o.strip() for o in (words[-1] if len(words) > 1 else "").split(",")]
            if op.startswith("HGMMA"):
                shape = re.search(r"HGMMA\.64x(\d+)x", op)
                acc_regs |= _registers(operands[0], int(shape[1]) // 2 if shape else 64)
                if operands[1].startswith("R"):
                    a_regs |= _registers(operands[1], 4)
                if "gsb0" in text:
                    groups.append((a_regs, acc_regs))
                    a_regs, acc_regs = set(), set()
                continue
            if text.startswith("WARPGROUP.DEPBAR.LE"):
                keep = int(text.rsplit(",", 1)[1].strip(), 16)
                groups = groups[len(groups) - keep:] if keep else []
                continue
            if replay == 0 or not groups:
                continue
            busy_a = set().union(*(g[0] for g in groups))
            busy_acc = set().union(*(g[1] for g in groups))
            width = 4 if ".128" in op else 2 if (".64" in op or ".WIDE" in op) else 1
            written = set() if op.startswith(_NO_DESTINATION) else _registers(operands[0], width)
            read = set().union(*(_registers(o, 1) for o in operands[1:])) if len(operands) > 1 else set()
            if written & (busy_a | busy_acc) or read & busy_acc:
                found.append(text)
    return found


def barrier_aliases(ptx: str) -> list[int]:
    """Shared-memory offsets that a kernel initializes as an mbarrier and also reads or writes as
    plain data (``ld.shared``/``st.shared`` at the same constant address), sorted. The PTX ISA
    leaves that undefined unless the barrier is invalidated first (``mbarrier.inval``), and Triton
    3.6's allocator did it: it gave the 8 bytes of a barrier that was initialized and never used
    to the word ``gl.warp_specialize`` passes a captured value through (NOTES.md v26: the Gluon
    backward whose consumers read their tile count from a barrier's word hung when processes
    shared the GPU). Addresses are followed through ``mov.b32 %r, global_smem`` and
    ``add.s32 %r, %r, N``; an access through any other computed address is not seen."""
    bases: set[str] = set()
    offsets: dict[str, int] = {}
    barriers: set[int] = set()
    plain: set[int] = set()

    def address(operand: str) -> int | None:
        operand = operand.strip()
        if operand.startswith("global_smem"):
            rest = operand[len("global_smem"):].replace(" ", "")
            return int(rest[1:]) if rest.startswith("+") else 0 if not rest else None
        return offsets.get(operand)

    for line in ptx.splitlines():
        text = line.strip()
        if (found := re.match(r"mov\.(?:b32|u32|b64|u64)\s+(%r\w*\d+),\s*global_smem;", text)):
            bases.add(found[1])
        elif (found := re.match(r"add\.(?:s32|u32|s64|u64)\s+(%r\w*\d+),\s*(%r\w*\d+),\s*(\d+);", text)):
            if found[2] in bases:
                offsets[found[1]] = int(found[3])
            elif found[2] in offsets:
                offsets[found[1]] = offsets[found[2]] + int(found[3])
        elif (found := re.search(r"mbarrier\.init[\w.:]*\s+\[([^\]]+)\]", text)):
            if (at := address(found[1])) is not None:
                barriers.add(at)
        elif (found := re.match(r"(?:@!?%p\d+\s+)?(?:ld|st)\.shared(?:::cta)?(?:\.v\d)?\.[busf]\d+\s+(?:[^\[]*)\[([^\]]+)\]",
                                text)):
            if (at := address(found[1])) is not None:
                plain.add(at)
    return sorted(at for at in plain if any(b <= at < b + 8 for b in barriers))


def barrier_alias_words(ptx: str) -> tuple[str, bool]:
    """The compile checks' words on :func:`barrier_aliases`, and whether there are none."""
    aliases = barrier_aliases(ptx)
    text = f"; {len(aliases)} mbarrier words also read or written as data"
    return text + (f" (at {', '.join(map(str, aliases))})" if aliases else ""), not aliases


def ptx_counts(ptx: str) -> tuple[int, int, list[str], list[int], list[int], list[str], int]:
    """(registers, spilled bytes, ptxas warnings, setmaxnreg decreases, increases, wgmma shapes, TMA
    loads) of a kernel's PTX: what both compile tools report first."""
    regs, spills, warnings = _ptxas_report(ptx)
    dec = sorted({int(n) for n in re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+)", ptx)})
    inc = sorted({int(n) for n in re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", ptx)})
    wgmma = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\S+?)\s", ptx)))
    # The destination is shared::cluster in triton 3.6's PTX, shared::cta in 3.9's.
    tma_loads = len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::(?:cluster|cta)\.global", ptx))
    return regs, spills, warnings, dec, inc, wgmma, tma_loads


def describe(compiled, shared_limit: int) -> tuple[str, bool]:
    """One line on a compiled kernel, and whether it is acceptable (no spills, fits)."""
    ptx = compiled.asm["ptx"]
    regs, spills, warnings, dec, inc, wgmma, tma_loads = ptx_counts(ptx)
    tma_stores = len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx))
    sass = _sass(compiled.asm["cubin"])
    ops = [_opcode(text) for _, text in sass]
    hgmma = sum(op.startswith("HGMMA") for op in ops)
    utma = (sum(op.startswith("UTMALDG") for op in ops), sum(op.startswith("UTMASTG") for op in ops))
    loops = _product_loops(sass)
    hazards = [text for body in loops for text in _hazards(body)]
    if not loops:
        loop = "product loops not found"
    else:
        inside, total = _overlap(loops[0])
        loop = (f"{len(loops)} product loops, the first (whole tiles; with a window, its masked left edge) "
                f"{len(loops[0])} instrs with "
                f"{inside}/{total} MUFU under the PV product; {len(hazards)} touches of in-flight wgmma "
                f"registers in them")
        if hazards:
            loop += " (" + "; ".join(hazards[:4]) + ")"
    shared = compiled.metadata.shared
    fits = shared <= shared_limit
    line = (f"regs {regs} at launch, setmaxnreg dec {dec} inc {inc}; spills {spills} B; shared "
            f"{shared} B{'' if fits else ' (OVER THE LIMIT)'}; PTX wgmma {wgmma}, TMA loads {tma_loads} "
            f"stores {tma_stores}; SASS HGMMA {hgmma}, UTMALDG {utma[0]}, UTMASTG {utma[1]}; {loop}")
    if spills and loops:  # where the spills sit: outside the product loops they cost once an item
        local = [sum(_opcode(text).startswith(("LDL", "STL")) for text in body) for body in loops]
        line += f"; local-memory instrs in the product loops {local}"
    words, no_aliases = barrier_alias_words(ptx)
    line += words
    serial = serialized(warnings)
    line += serial
    if warnings:
        line += "; ptxas: " + " | ".join(warnings)
    return line, spills == 0 and fits and regs > 0 and not hazards and no_aliases and not serial


def main() -> int:
    parser = compile_parser(__doc__, "n128s3, n128s2-eager")
    parser.add_argument("--softcap", action="store_true", help="compile every kernel with softcap (one-item grid)")
    parser.add_argument("--sinks", action="store_true",
                        help="compile every kernel with attention sinks (one-item grid)")
    parser.add_argument("--fp8", action="store_true",
                        help="compile the FP8 (e4m3) kernel instead, d64 and d128, causal and not "
                             "(fp8_config, and each --config)")
    args = parser.parse_args()

    sys.path.insert(0, str(HERE))
    gf, torch = stand_in_target(load_gluon_forward)
    if gf is None:
        return 1
    extra = [] if args.quick else ["n128s3", "n128s2", "n64s2", "n128s2-nopp", "n128s2-eager"]
    matrix = config_matrix(gf, args.quick, extra + args.config, args.causal)
    if args.fp8:  # the FP8 kernel's configuration, and each --config (one-item grid, eager only)
        matrix = [(head_dim, causal, torch.float8_e4m3fn, config)
                  for head_dim in gf.HEAD_DIMS for causal in (False, True)
                  for config in dict.fromkeys([gf.fp8_config(head_dim, causal, n_k) for n_k in (4096, 16384)]
                                              + [gf.Config.parse(text) for text in args.config])]
    else:  # MLA (Q's and K's head dim above V's): its default, causal and not, in each dtype
        dtypes = (torch.bfloat16,) if args.quick else (torch.bfloat16, torch.float16)
        matrix += [(head_dim, causal, dtype, gf.default_config(head_dim, causal, None, head_dim_v))
                   for head_dim, head_dim_v in gf.HEAD_DIM_PAIRS if head_dim_v != head_dim
                   for causal in (False, True) for dtype in dtypes]

    def warm(head_dim, causal, dtype, config):
        q = torch.empty(1, 2, 1000, head_dim, dtype=dtype)
        v = torch.empty(1, 2, 1000, value_dim(gf, head_dim), dtype=dtype)
        if args.fp8:
            return gf.warmup_fp8(q, torch.empty_like(q), torch.empty_like(q), causal, head_dim ** -0.5, config)
        window = (256, 0) if args.window else None
        return gf.warmup(q, torch.empty_like(q), v, causal, head_dim ** -0.5, config, args.alibi, window,
                         30.0 if args.softcap else 0.0, args.sinks)

    one_item = args.window or args.softcap or args.sinks
    if one_item:  # windows, softcap and sinks take the one-item grid: each head dim's default for them
        matrix = [(head_dim, causal, dtype, gf.default_config(head_dim, causal, None, value_dim(gf, head_dim), True)
                   if config.persistent else config) for head_dim, causal, dtype, config in matrix]
        matrix = list(dict.fromkeys(matrix))
    prefix = "fp8 " if args.fp8 else "".join(f"{name} " for name in ("window", "softcap", "sinks", "alibi")
                                             if getattr(args, name))
    failures, _ = compile_matrix(gf, matrix, prefix, warm, describe, args.dump, 2000)
    print("OK" if failures == 0 else f"{failures} configuration(s) failed, spilled or did not fit")
    return 1 if failures else 0


def compile_parser(doc: str, examples: str) -> argparse.ArgumentParser:
    """A compile tool's argument parser with the options both have (``--quick``, ``--config``
    with ``examples``, ``--causal``, ``--alibi``, ``--window``, ``--dump``); the tool adds its own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="only the default configurations, bf16")
    parser.add_argument("--config", action="append", default=[], metavar="CFG",
                        help=f"another configuration to compile at d128 and d64 (e.g. {examples})")
    parser.add_argument("--causal", action="store_true",
                        help="compile each --config causal too (causal kernels hold other registers: the masked tiles)")
    parser.add_argument("--alibi", action="store_true",
                        help="compile every kernel with ALiBi (its own kernels; the backward's: d64 and d128, no MLA)")
    parser.add_argument("--window", action="store_true",
                        help="compile every kernel with a sliding window (its own kernels; the forward's: the "
                             "one-item grid's configurations only; the backward's: d64 and d128, no MLA, no -rot)")
    parser.add_argument("--dump", metavar="DIR", help="write each kernel's PTX, SASS and TTGIR here")
    return parser


def stand_in_target(load):
    """Set sm_90a's stand-in driver (no GPU), load the kernel's module by ``load()`` and print the
    versions: (the module, torch), or (None, torch) with the reason printed where Gluon is not
    available."""
    import torch
    from sm90_compile import _TargetOnly
    from triton.runtime import driver

    driver.set_active(_TargetOnly(90))
    module = load()
    if module.GLUON_IMPORT_ERROR is not None:
        print(f"Gluon is not available: {module.GLUON_IMPORT_ERROR}")
        return None, torch
    import triton

    print(f"triton {triton.__version__}, torch {torch.__version__}, target sm_90a (no GPU: a stand-in driver)")
    return module, torch


def config_matrix(module, quick: bool, configs: list[str], causal_too: bool = False) -> list[tuple]:
    """What to compile, (head dim, causal, dtype, config): ``module``'s (gluon_forward's or
    gluon_backward's) default of each head dim, causal and not, in bf16 (and fp16 unless
    ``quick``); then each of ``configs`` at each head dim, bf16 and not causal, unless it is that
    head dim's default (and causal too with ``causal_too``, unless it is the causal default)."""
    import torch

    matrix = []
    dtypes = (torch.bfloat16,) if quick else (torch.bfloat16, torch.float16)
    for head_dim in module.HEAD_DIMS:
        for causal in (False, True):
            for dtype in dtypes:
                matrix.append((head_dim, causal, dtype, module.default_config(head_dim, causal)))
    for text in configs:
        config = module.Config.parse(text)
        for head_dim in module.HEAD_DIMS:
            for causal in (False, True) if causal_too else (False, ):
                if config != module.default_config(head_dim, causal):
                    matrix.append((head_dim, causal, torch.bfloat16, config))
    return matrix


def value_dim(module, head_dim: int) -> int:
    """V's head dim that goes with Q's ``head_dim`` in ``module``'s kernels: MLA's 128 beside 192
    (the forward's ``HEAD_DIM_PAIRS``), else the same."""
    return dict(getattr(module, "HEAD_DIM_PAIRS", ())).get(head_dim, head_dim)


def compile_matrix(module, matrix: list[tuple], prefix: str, warm, describe, dump: str | None,
                   error_chars: int) -> tuple[int, list[str]]:
    """Compile each (head dim, causal, dtype, config) of ``matrix`` by ``warm`` (the module's
    ``warmup`` on inputs of that kind), skipping what does not fit ``module.SHARED_LIMIT``; print a
    line on each (``describe``, its name led by ``prefix``) and write its PTX, TTGIR and SASS under
    ``dump``. (Failures, names of the configurations that spilled.)"""
    failures = 0
    spilled = []
    folder = Path(dump) if dump else None
    if folder:
        folder.mkdir(parents=True, exist_ok=True)
    for head_dim, causal, dtype, config in matrix:
        head_dim_v = value_dim(module, head_dim)
        dims = f"d{head_dim}" + (f"/dv{head_dim_v}" if head_dim_v != head_dim else "")
        name = f"{prefix}{dims} {'causal' if causal else 'full'} {str(dtype).split('.')[-1]} {config}"
        fp8 = dtype.itemsize == 1 and hasattr(module, "fp8_shared_bytes")
        if fp8:
            need = module.fp8_shared_bytes(config, head_dim)
        elif head_dim_v != head_dim:
            need = module.shared_bytes(config, head_dim, head_dim_v=head_dim_v)
        else:
            need = module.shared_bytes(config, head_dim)
        if need > module.SHARED_LIMIT:
            print(f"{name}: skipped, needs {need} B of shared memory (limit {module.SHARED_LIMIT})", flush=True)
            continue
        start = time.time()
        try:
            compiled = warm(head_dim, causal, dtype, config)
        except Exception as exc:  # report and go on: one bad configuration must not hide the rest
            failures += 1
            print(f"{name}: FAILED to compile: {type(exc).__name__}: {str(exc)[:error_chars]}", flush=True)
            continue
        line, ok = describe(compiled, module.SHARED_LIMIT)
        failures += not ok
        if "spills 0 B" not in line:
            spilled.append(name)
        print(f"{name} ({time.time() - start:.0f} s): {line}", flush=True)
        if folder:
            stem = name.replace(" ", "_").replace("/", "-")  # d192/dv128: no folder
            (folder / f"{stem}.ptx").write_text(compiled.asm["ptx"])
            (folder / f"{stem}.ttgir").write_text(compiled.asm["ttgir"])
            (folder / f"{stem}.sass").write_text("\n".join(f"/*{a:04x}*/ {t};" for a, t in _sass(compiled.asm["cubin"])))
    return failures, spilled


if __name__ == "__main__":
    sys.exit(main())
