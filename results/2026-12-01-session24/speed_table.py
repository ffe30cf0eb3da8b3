"""A speed table from a main-job pytest.log: triton_flash beside torch_sdpa and torch_flex, TFLOP/s.

Usage: python3 speed_table.py PYTEST_LOG   (printed markdown; e4m3 cases left out)"""
import re, sys
rows = {}
lines = open(sys.argv[1]).read().splitlines()
for a, b in zip(lines, lines[1:]):
    m = re.match(r"^(triton_flash|torch_sdpa|torch_flex) +(fwd|bwd) +(\S+)$", a)
    n = re.search(r"TFLOP/s ([\d.]+)", b)
    if m and n:
        rows.setdefault((m[2], m[3]), {})[m[1]] = float(n[1])
print("| pass | case | triton_flash | torch_sdpa | torch_flex | x sdpa | x flex |")
print("|---|---|---|---|---|---|---|")
for (p, c), t in sorted(rows.items()):
    if "e4m3" in c: continue
    tf = t.get("triton_flash"); f = lambda k: f"{t[k]:.0f}" if k in t else "-"
    r = lambda k: f"{tf / t[k]:.2f}" if tf and k in t else "-"
    print(f"| {p} | {c} | {f('triton_flash')} | {f('torch_sdpa')} | {f('torch_flex')} | {r('torch_sdpa')} | {r('torch_flex')} |")
