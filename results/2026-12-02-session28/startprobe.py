"""Where a worker's start-up goes on the GPU machine: each phase's time, one process alone and 16 at once."""
import json, os, subprocess, sys, time

SNIPPET = r'''
import sys, time, json
t0 = float(sys.argv[1]); out = {"python": time.time() - t0}
import torch; out["torch"] = time.time() - t0
import pytest_attnkit.worker.server as server
from pytest_attnkit.worker.handlers import Handlers
Handlers(json.loads(sys.argv[4])); out["harness"] = time.time() - t0
name, value = sys.argv[2], sys.argv[3]
if name == "probe":
    from pytest_attnkit.worker.environment import describe_environment
    describe_environment("auto"); out["probe"] = time.time() - t0
elif name != "spare":
    from pytest_attnkit.registry import load_implementation
    impl = load_implementation(name, value); out["load"] = time.time() - t0
    reason = impl.unavailable_reason("cuda"); out["unavailable"] = time.time() - t0; out["reason"] = reason
    impl.path_note("cuda"); out["path_note"] = time.time() - t0
    impl.capabilities(); out["capabilities"] = time.time() - t0
print(json.dumps({"name": name, **{k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}}))
'''

def main():
    from pytest_attnkit.registry import discover
    from pytest_attnkit.controller.discovery import BUNDLED
    handlers = json.dumps({n: s.handler for n, s in BUNDLED.items()})
    refs = [(r.name, r.value) for r in discover() if r.name in ("torch_sdpa", "triton_flash", "cupy_naive", "torch_flex")]
    env = {**os.environ, "ATTNKIT_PROBE": "1"}
    for label, group in (("alone", [(n, v) for n, v in refs] + [("probe", "")]),
                         ("at once", refs + [("probe", "")] + [("spare", "")] * 11)):
        print(f"== {label}")
        if label == "alone":
            for n, v in group:
                p = subprocess.run([sys.executable, "-c", SNIPPET, str(time.time()), n, v, handlers], capture_output=True, text=True, env=env)
                print(p.stdout.strip() or p.stderr[-500:])
        else:
            t = time.time()
            procs = [subprocess.Popen([sys.executable, "-c", SNIPPET, str(t), n, v, handlers], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for n, v in group]
            for p in procs:
                o, e = p.communicate()
                print(o.strip() or e[-500:])

main()
