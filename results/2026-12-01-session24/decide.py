"""Session 24: flip gluon_backward.TAKES_ALIBI / TAKES_WINDOW by the rule fixed before the run:
every ALiBi/window correctness case right, and the Gluon backward faster than the Triton one on
every timing of that variant. Prints the decision; with --apply, edits gluon_backward.py."""
import gzip, json, re, sys
d = json.load(gzip.open(sys.argv[1]) if sys.argv[1].endswith(".gz") else open(sys.argv[1]))
cases = {k: v for k, v in d["correct"].items() if "alibi" in k or re.search(r" w\d+:\d+", k)}
bad = [k for k, v in cases.items() if not v.get("passed")]
print(f"alibi/window correctness: {len(cases) - len(bad)} of {len(cases)} passed; failed: {bad[:8]}")
flip = {}
for name, test in (("ALIBI", lambda k: "alibi" in k), ("WINDOW", lambda k: re.search(r" w\d+:\d+", k))):
    timed = {k: v.get("tflops", {}) for k, v in d["bench"].items() if test(k) and not ("alibi" in k and re.search(r" w\d+:", k))}
    ratios = {k: (t["gluon"] / t["triton_flash"] if "gluon" in t and "triton_flash" in t else None) for k, t in timed.items()}
    print(name, {k: (round(r, 3) if r else r) for k, r in ratios.items()})
    flip[name] = not bad and bool(ratios) and all(r is not None and r >= 1.0 for r in ratios.values())
print("decision:", flip)
if "--apply" in sys.argv:
    p = "implementations/triton_flash/gluon_backward.py"
    s = open(p).read()
    for name, on in flip.items():
        if on:
            s = s.replace(f"TAKES_{name} = False", f"TAKES_{name} = True")
    open(p, "w").write(s)
    print(re.findall(r"TAKES_\w+ = \w+", s))
