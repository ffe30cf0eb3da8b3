"""Compile triton_flash's Gluon forward for sm_90a without a GPU, and say what came out.

A stand-in driver (``sm90_compile._TargetOnly``) answers Triton's questions about the device, so
``warmup`` compiles the kernel exactly as ``gluon_forward.flash_fwd`` would launch it
(``gluon_forward.launch_arguments``). For each configuration it reports:

- registers: the launch count (ptxas) and each partition's ``setmaxnreg`` (the producer's
  decrease, the consumers' increase), spills (ptxas ``-v``, its warnings too, e.g. wgmma
  serialization), shared memory;
- instructions: the PTX's ``wgmma.mma_async`` shapes and TMA (``cp.async.bulk.tensor``) loads and
  stores; in the SASS, HGMMA, UTMALDG/UTMASTG, and the consumer's whole-tile loop: its length
  and how much of the softmax (MUFU.EX2) ptxas left between the wait for S (``WARPGROUP.DEPBAR.LE
  gsb0, 0x1``) and the wait for the PV product (``..., 0x0``), i.e. overlapped with that product.

Usage: python3 tools/flash_bench/gluon_compile.py [--quick] [--dump DIR] [--config n128s2 ...]
(``--quick``: the two default configurations, bf16, causal and not; ``--config`` adds others.)
Exit status 1 if any configuration fails to compile, spills, or does not fit in shared memory.
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


def load_gluon_forward():
    """``gluon_forward`` from the installed package, or from this checkout by path (it imports
    only torch and triton), so that the tools run without ``pip install -e .``."""
    try:
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


def _ptxas_report(ptx: str) -> tuple[int, int, list[str]]:
    """(registers, spilled bytes stored + loaded, warnings) from ptxas -v on the kernel's PTX."""
    with tempfile.TemporaryDirectory() as folder:
        source, target = Path(folder) / "k.ptx", Path(folder) / "k.cubin"
        source.write_text(ptx)
        run = subprocess.run([_tool("ptxas"), "-v", "--warn-on-spills", "-arch=sm_90a", str(source), "-o",
                              str(target)], capture_output=True, text=True)
    text = run.stdout + run.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", text))
    warnings = [line.strip() for line in text.splitlines() if "warning" in line.lower()]
    return (int(regs[1]) if regs else -1), spills, warnings


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


def _whole_tile_loop(sass: list[tuple[int, str]]) -> list[str] | None:
    """The first consumer loop that issues both products (QK^T from shared memory with no
    accumulator, PV with P from registers): the whole-tile loop, which the kernel places first."""
    for index, (address, instruction) in enumerate(sass):
        target = re.search(r"BRA (0x[0-9a-f]+)", instruction)
        if not target or int(target[1], 16) >= address:
            continue
        body = [text for at, text in sass if int(target[1], 16) <= at <= address]
        if len(body) < 3000 and any("!UPT" in t and "HGMMA" in t for t in body) and any(
                "tnspB" in t for t in body):
            return body
    return None


def _overlap(body: list[str]) -> tuple[int, int]:
    """(MUFU between the waits for S and for PV, MUFU in the loop): how much of the softmax's
    exp2 ptxas scheduled under the PV product."""
    total = sum(_opcode(t).startswith("MUFU") for t in body)
    inside, between = 0, False
    for text in body:
        if text.startswith("WARPGROUP.DEPBAR.LE"):
            between = text.endswith("0x1")
        elif between and _opcode(text).startswith("MUFU"):
            inside += 1
    return inside, total


def describe(compiled, shared_limit: int) -> tuple[str, bool]:
    """One line on a compiled kernel, and whether it is acceptable (no spills, fits)."""
    ptx = compiled.asm["ptx"]
    regs, spills, warnings = _ptxas_report(ptx)
    dec = sorted({int(n) for n in re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+)", ptx)})
    inc = sorted({int(n) for n in re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", ptx)})
    wgmma = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\S+?)\s", ptx)))
    tma_loads = len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global", ptx))
    tma_stores = len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx))
    sass = _sass(compiled.asm["cubin"])
    ops = [_opcode(text) for _, text in sass]
    hgmma = sum(op.startswith("HGMMA") for op in ops)
    utma = (sum(op.startswith("UTMALDG") for op in ops), sum(op.startswith("UTMASTG") for op in ops))
    body = _whole_tile_loop(sass)
    if body is None:
        loop = "whole-tile loop not found"
    else:
        inside, total = _overlap(body)
        loop = f"whole-tile loop {len(body)} instrs, {inside}/{total} MUFU between the S and PV waits"
    shared = compiled.metadata.shared
    fits = shared <= shared_limit
    line = (f"regs {regs} at launch, setmaxnreg dec {dec} inc {inc}; spills {spills} B; shared "
            f"{shared} B{'' if fits else ' (OVER THE LIMIT)'}; PTX wgmma {wgmma}, TMA loads {tma_loads} "
            f"stores {tma_stores}; SASS HGMMA {hgmma}, UTMALDG {utma[0]}, UTMASTG {utma[1]}; {loop}")
    if warnings:
        line += "; ptxas: " + " | ".join(warnings)
    return line, spills == 0 and fits and regs > 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="only the default configurations, bf16")
    parser.add_argument("--config", action="append", default=[], metavar="CFG",
                        help="another configuration to compile at d128 and d64 (e.g. n128s3, n128s2-u2)")
    parser.add_argument("--dump", metavar="DIR", help="write each kernel's PTX, SASS and TTGIR here")
    args = parser.parse_args()

    sys.path.insert(0, str(HERE))
    import torch
    from sm90_compile import _TargetOnly
    from triton.runtime import driver

    driver.set_active(_TargetOnly(90))
    gf = load_gluon_forward()
    if gf.GLUON_IMPORT_ERROR is not None:
        print(f"Gluon is not available: {gf.GLUON_IMPORT_ERROR}")
        return 1
    import triton

    print(f"triton {triton.__version__}, torch {torch.__version__}, target sm_90a (no GPU: a stand-in driver)")
    matrix = []
    dtypes = (torch.bfloat16,) if args.quick else (torch.bfloat16, torch.float16)
    for head_dim in gf.HEAD_DIMS:
        for causal in (False, True):
            for dtype in dtypes:
                matrix.append((head_dim, causal, dtype, gf.default_config(head_dim, causal)))
    extra = [] if args.quick else ["n128s3", "n64s2", "n128s2-nopp", "n128s2-u2"]
    for text in extra + args.config:
        config = gf.Config.parse(text)
        for head_dim in gf.HEAD_DIMS:
            if config != gf.default_config(head_dim, False):
                matrix.append((head_dim, False, torch.bfloat16, config))

    failures = 0
    dump = Path(args.dump) if args.dump else None
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
    for head_dim, causal, dtype, config in matrix:
        name = f"d{head_dim} {'causal' if causal else 'full'} {str(dtype).split('.')[-1]} {config}"
        need = gf.shared_bytes(config, head_dim)
        if need > gf.SHARED_LIMIT:
            print(f"{name}: skipped, needs {need} B of shared memory (limit {gf.SHARED_LIMIT})", flush=True)
            continue
        batch, heads, n = 1, 2, 1000
        q = torch.empty(batch, heads, n, head_dim, dtype=dtype)
        k, v, o = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)
        lse = torch.empty(batch, heads, n)
        launch_args, kwargs, _ = gf.launch_arguments(q, k, v, o, lse, causal, head_dim ** -0.5, config)
        start = time.time()
        try:
            compiled = gf._attn_fwd_sm90.warmup(*launch_args, **kwargs, grid=(1,))
        except Exception as exc:  # report and go on: one bad configuration must not hide the rest
            failures += 1
            print(f"{name}: FAILED to compile: {type(exc).__name__}: {str(exc)[:2000]}", flush=True)
            continue
        line, ok = describe(compiled, gf.SHARED_LIMIT)
        failures += not ok
        print(f"{name} ({time.time() - start:.0f} s): {line}", flush=True)
        if dump:
            stem = name.replace(" ", "_")
            (dump / f"{stem}.ptx").write_text(compiled.asm["ptx"])
            (dump / f"{stem}.ttgir").write_text(compiled.asm["ttgir"])
            (dump / f"{stem}.sass").write_text("\n".join(f"/*{a:04x}*/ {t};" for a, t in _sass(compiled.asm["cubin"])))
    print("OK" if failures == 0 else f"{failures} configuration(s) failed, spilled or did not fit")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
