"""The proof of ``--attnkit-against`` (issue 20), run on a GPU machine: see run.sh beside it.

Three kinds of runs, all in a scratch git repository made from a copy of this tree (the GPU
machine gets the tree from ``git archive``, so it is no repository):

- ``clean`` (EXTRA 0): the working tree at ``base`` against ``base``: HEAD against HEAD.
- slowed (EXTRA > 0): the working tree at ``slow``, one commit on ``base`` whose triton_flash
  adapter runs extra work after every forward call, sized by ``ATTNKIT_EXTRA_WORK`` to that share
  of the kernel's own time (the calibration of ``tools/gate_proof/site/slowable_kernels.py``,
  copied into the package), against ``base``. Both sides inherit the variable; only ``slow``'s
  code reads it.
- ``plain`` (a group whose name starts with ``plain``): the clean selection without
  ``--attnkit-against``, for the wall-time ratio.

The scratch copy is installed editable into this Python (``pip install -e``, no dependencies,
no build isolation), so the current side of every run is its working tree; the original tree
is installed editable again at the end. Each run writes ``--attnkit-report`` into the scratch
folder, and the verdicts are read from its JSON (``ab``: the paired A/B gate; ``speed.gate``:
the stored-baseline gate, which a run with a baseline file for this GPU applies in the same
run). Every line of the summary and the log is written as it happens.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]
DEFAULT_GROUPS = ["clean:0:1", "plain:0:1", "clean:0:4", "slower5:0.05:10", "slower3:0.03:10"]
#: The four forward shapes of tools/gate_proof/run.sh, non-causal, no variant (ALiBi, softcap).
DEFAULT_SLOW_K = ("test_speed_forward and not causal and not alibi and not cap30 and "
                  "(q1024-k1024-d128 or q4096-k4096-d128 or q16384-k16384-d128 or q4096-k4096-d64)")
#: The stored gate's default practical threshold (pytest_attnkit/controller/options.py).
STORED_DEFAULT_THRESHOLD = 0.08
ALPHA = 0.01
SLOWED_IMPL = "triton_flash"
IGNORED = {".git", ".venv", ".venv-ci", "results", "__pycache__", ".pytest_cache", ".benchmarks", "build", "dist",
           "attnkit-report", ".whl", ".gpu_snap"}

ADAPTER_PATCH = '''

# -- the slow revision of the --attnkit-against proof (tools/against_proof) ---------------------
# Every forward call also runs the kernel on a slice of the inputs and throws that away: the output
# is unchanged, the call takes longer by the share ATTNKIT_EXTRA_WORK of the kernel's own time
# (calibrated on the GPU once per shape by extra_work.py; on the CPU a share of the rows).
_forward_without_extra_work = TritonFlash.forward


def _forward_with_extra_work(self, q, k, v, *, causal=False, scale=None, **variants):
    out = _forward_without_extra_work(self, q, k, v, causal=causal, scale=scale, **variants)
    from . import extra_work  # here, not above: extra_work imports this package's flash_attention

    extra_work.add_extra_work(q, k, v, causal=causal, scale=scale)
    return out


TritonFlash.forward = _forward_with_extra_work
'''

EXTRA_WORK_TAIL = '''

def add_extra_work(q, k, v, *, causal=False, scale=None):
    """The extra work of ``slowable_flash`` alone (added by tools/against_proof)."""
    extra = float(os.environ.get("ATTNKIT_EXTRA_WORK", "0"))
    if extra > 0:
        rows, keys = _extra_work(q, k, v, causal, scale, extra)
        flash_attention(q[..., :rows, :], k[..., :keys, :], v[..., :keys, :], causal=False, scale=scale)
'''


class Proof:
    def __init__(self, out: Path, groups: list[str]) -> None:
        self.out = out
        self.groups = groups
        self.python = os.environ.get("PYTHON") or sys.executable
        self.impls = os.environ.get("IMPLS", "torch_sdpa,triton_flash")
        self.slow_impls = os.environ.get("SLOW_IMPLS", SLOWED_IMPL)
        self.clean_k = os.environ.get("CLEAN_K", "")
        self.slow_k = os.environ.get("SLOW_K", DEFAULT_SLOW_K)
        self.threshold = os.environ.get("THRESHOLD", "")
        self.deadline = float(os.environ["DEADLINE_S"]) if os.environ.get("DEADLINE_S") else None
        self.start = time.time()
        self.work = Path(os.environ.get("SCRATCH") or tempfile.mkdtemp(prefix="against-proof-"))
        self.repo = self.work / "pytest-attnkit"
        self.summary = out / "against-proof.summary.txt"
        self.log = out / "against-proof.log"
        self.calibration = out / "calibration.jsonl"
        self.runs: list[dict] = []
        self.installed_scratch = False
        self.base = self.slow = ""
        self.checked_out = ""
        self.trees: dict[str, dict[Path, str | None]] = {}
        #: REV is a git revision of the scratch repository, or (no git, or REV_MODE=path) a copy's path.
        self.git_mode = shutil.which("git") is not None and os.environ.get("REV_MODE", "git") != "path"
        self.benchmark_flag: list[str] = []
        #: A folder whose ``matplotlib`` fails to import, first on the runs' PYTHONPATH: the report's
        #: plots (seconds a run, in every run alike) are skipped; PLOTS=1 keeps them.
        self.no_plots = None if os.environ.get("PLOTS") else self.work / "no-plots"

    # -- output, written as it goes ---------------------------------------------------------
    def say(self, line: str = "") -> None:
        print(line, flush=True)
        for path in (self.summary, self.log):
            with open(path, "a", encoding="utf-8") as stream:
                stream.write(line + "\n")

    def note(self, line: str) -> None:
        """A line for the log only."""
        with open(self.log, "a", encoding="utf-8") as stream:
            stream.write(line + "\n")

    # -- setup ------------------------------------------------------------------------------
    def sh(self, *command: str, cwd: Path | None = None) -> str:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"against-proof: `{' '.join(command)}` exited {done.returncode}:\n"
                             f"{(done.stdout + done.stderr)[-3000:]}")
        return done.stdout.strip()

    def git(self, *args: str) -> str:
        return self.sh("git", "-C", str(self.repo), *args)

    def copy_tree(self) -> None:
        out = self.out.resolve()

        def ignore(folder: str, names: list[str]) -> set[str]:
            skipped = {name for name in names if name in IGNORED or name.endswith(".egg-info")}
            skipped |= {name for name in names if (Path(folder) / name).resolve() in (out, self.work.resolve())}
            return skipped

        shutil.copytree(SRC, self.repo, ignore=ignore, symlinks=True)

    def make_versions(self) -> None:
        """``base`` and ``slow``: two commits of the scratch repository, REV the base's sha. Without
        git (or with REV_MODE=path) a pristine copy of the tree is REV instead, as a checkout path,
        and the working tree switches by writing the slow revision's two files."""
        package = self.repo / "implementations" / "triton_flash"
        adapter, extra_work = package / "adapter.py", package / "extra_work.py"
        original = adapter.read_text(encoding="utf-8")
        if "class TritonFlash(" not in original:
            raise SystemExit(f"against-proof: {adapter} no longer defines class TritonFlash; the slow revision "
                             "patches its forward")
        source = (self.repo / "tools" / "gate_proof" / "site" / "slowable_kernels.py").read_text(encoding="utf-8")
        self.trees = {"base": {adapter: original, extra_work: None},
                      "slow": {adapter: original + ADAPTER_PATCH, extra_work: source + EXTRA_WORK_TAIL}}
        if not self.git_mode:
            shutil.copytree(self.repo, self.work / "base", symlinks=True)
            self.base = str(self.work / "base")
            self.write_tree("slow")
            self.slow = "(the working tree's two files)"
            return
        self.sh("git", "init", "-q", str(self.repo))
        self.git("config", "user.name", "against-proof")
        self.git("config", "user.email", "against-proof@localhost")
        self.git("config", "commit.gpgsign", "false")
        self.git("add", "-A")
        self.git("commit", "-q", "-m", "base: the tree under test")
        self.base = self.git("rev-parse", "HEAD")
        self.write_tree("slow")
        self.git("add", str(adapter), str(extra_work))
        self.git("commit", "-q", "-m", "slow: triton_flash's forward also runs extra work sized by ATTNKIT_EXTRA_WORK")
        self.slow = self.git("rev-parse", "HEAD")

    def write_tree(self, name: str) -> None:
        for path, text in self.trees[name].items():
            if text is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(text, encoding="utf-8")
        self.checked_out = name

    def checkout(self, name: str) -> None:
        """The working tree at ``base`` or ``slow``: git checkout, or the files written without git."""
        if self.checked_out == name:
            return
        if self.git_mode:
            self.git("checkout", "-q", "--detach", self.base if name == "base" else self.slow)
            self.checked_out = name
        else:
            self.write_tree(name)

    def pip_install_editable(self, tree: Path) -> None:
        self.sh(self.python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                "--disable-pip-version-check", "--no-input", "-e", str(tree))

    def device_line(self) -> str:
        try:
            done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,serial",
                                   "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
            return done.stdout.strip().replace("\n", "; ") or f"nvidia-smi printed nothing ({done.stderr.strip()})"
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"no GPU seen ({error})"

    # -- one run ----------------------------------------------------------------------------
    def kind_of(self, name: str, extra: float) -> str:
        return "plain" if name.startswith("plain") else ("clean" if extra == 0 else "slow")

    def command(self, kind: str, report: Path | None) -> list[str]:
        impls, k = (self.impls, self.clean_k) if kind != "slow" else (self.slow_impls, self.slow_k)
        command = [self.python, "-m", "pytest", "--attnkit", "--attnkit-suite=speed", f"--attnkit-impl={impls}"]
        if kind != "plain":
            command.append(f"--attnkit-against={self.base}")
        if self.threshold:
            command.append(f"--attnkit-threshold={self.threshold}")
        if report is not None:
            command.append(f"--attnkit-report={report}")
        command += ["-p", "no:cacheprovider", "-q", *self.benchmark_flag]
        if k:
            command += ["-k", k]
        return command

    def estimate(self, name: str, given: float | None) -> float:
        """How long the next run of group ``name`` may take, with a tenth more for the noise: its
        longest run so far but the first (which calibrates the extra work, or finds caches cold)
        when there are others, else its first; before any run of it in this call, ``given`` (the
        group's fourth field) or else the longest run of any group (0 before the first run)."""
        own = [run["wall"] for run in self.runs if run["group"] == name]
        if own:
            return 1.1 * max(own[1:] or own)
        if given is not None:
            return given
        return 1.1 * max([run["wall"] for run in self.runs] or [0.0])

    def run(self, name: str, extra: float, index: int) -> dict:
        kind = self.kind_of(name, extra)
        label = f"{name}-{index}"
        report = self.work / "reports" / label
        command = self.command(kind, report)
        self.checkout("slow" if kind == "slow" else "base")
        env = dict(os.environ, ATTNKIT_EXTRA_WORK=str(extra), ATTNKIT_EXTRA_WORK_BASE="plain",
                   ATTNKIT_EXTRA_WORK_LOG=str(self.calibration), PYTHONUNBUFFERED="1")
        if self.no_plots is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.no_plots), os.environ.get("PYTHONPATH")]))
        first = not self.runs
        self.note(f"\n=== {label} ({kind}; ATTNKIT_EXTRA_WORK={extra}; working tree "
                  f"{self.checked_out})")
        self.note("command: " + " ".join(_quote(part) for part in command))
        offset = self.log.stat().st_size
        began = time.time()
        with open(self.log, "a", encoding="utf-8") as stream:
            child = subprocess.Popen(command, cwd=self.repo, env=env, stdout=stream, stderr=subprocess.STDOUT)
            try:
                status = child.wait()
            except KeyboardInterrupt:  # SIGTERM or Ctrl-C: pytest ends as on a CI timeout, and says so
                child.terminate()
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
                raise
        wall = time.time() - began
        with open(self.log, encoding="utf-8", errors="replace") as stream:
            stream.seek(offset)
            text = stream.read()
        tail = next((line.strip("= ") for line in reversed(text.splitlines()) if line.strip()), "")
        record = {"group": name, "label": label, "kind": kind, "extra": extra, "status": status, "wall": wall,
                  "first": first, "tail": tail, **self.verdicts(report / "attnkit-report.json")}
        if record["report"] and not any(run["report"] for run in self.runs):
            self.say("environment (from the first report): " + ", ".join(
                f"{key} {value}" for key, value in record["environment"].items()) + f", device {record['device']}")
        self.runs.append(record)
        self.say(self.run_line(record))
        return record

    def verdicts(self, path: Path) -> dict:
        """The run's A/B and stored-gate verdicts, from its report JSON."""
        if not path.exists():
            return {"report": False}
        document = json.loads(path.read_text(encoding="utf-8"))
        counterparts = set((document.get("against") or {}).get("twins", {}).values())  # the report's key
        ab = [entry for entry in document.get("ab") or []]
        gate = [d for d in document["speed"].get("gate") or [] if d["impl"] not in counterparts]
        stored_default = [d for d in gate if _regression(d, max(STORED_DEFAULT_THRESHOLD, d["threshold"]))]
        return {"report": True, "ab": ab, "gate": gate,
                "baseline": document["speed"].get("baseline_file") if document["speed"].get("baseline_found") else None,
                "stored_flagged": [d for d in gate if d["verdict"] == "regression"],
                "stored_default_flagged": stored_default,
                "device": document.get("device"),
                "environment": {key: document["environment"].get(key) for key in ("device_name", "torch", "triton")}}

    def run_line(self, r: dict) -> str:
        head = f"{r['label']:<11} extra={r['extra']:<5g} exit={r['status']} wall={r['wall']:4.0f} s"
        if not r["report"]:
            return f"{head}  no report written: {r['tail']}"
        parts = [head]
        if r["kind"] != "plain":
            parts.append(self.ab_text(r))
        if r["baseline"]:
            parts.append(f"stored gate at the run's threshold: {len(r['stored_flagged'])} of {len(r['gate'])} flagged"
                         + _names(r["stored_flagged"])
                         + f"; at its default 8% (derived): {len(r['stored_default_flagged'])}"
                         + _names(r["stored_default_flagged"]))
        else:
            parts.append("stored gate: no baseline file for this device")
        parts.append(f"[{r['tail']}]")
        return "  ".join(parts)

    def ab_text(self, r: dict) -> str:
        ab = r["ab"]
        compared = [e for e in ab if e["verdict"] != "not compared"]
        flagged = [e for e in compared if _gated_regression(e)]
        uncompared = len(ab) - len(compared)
        if r["kind"] == "slow":
            mine = [e for e in compared if e["impl"] == SLOWED_IMPL]
            caught = [e for e in mine if _gated_regression(e)]
            ratios = ", ".join(f"{_short(e)} {e['ratio']:.3f}{'*' if _gated_regression(e) else ''}"
                               for e in sorted(mine, key=lambda e: (e["mode"], e["case"])))
            others = [e for e in flagged if e["impl"] != SLOWED_IMPL]
            text = f"A/B {SLOWED_IMPL}: {len(caught)} of {len(mine)} flagged (new/old, * flagged: {ratios})"
            if len(compared) > len(mine):
                text += f"; others {len(others)} of {len(compared) - len(mine)} flagged" + _names(others)
        else:
            ratios = [e["ratio"] for e in compared]
            span = f"new/old {min(ratios):.3f}-{max(ratios):.3f}" if ratios else "nothing compared"
            text = f"A/B: {len(flagged)} of {len(compared)} flagged ({span})" + _names(flagged)
        ungated = [e for e in compared if e.get("ungated")]
        text += f"; {len(ungated)} shown, not gated (syncs)" if ungated else ""
        loosened = [e for e in compared if e.get("syncs")]
        text += f"; {len(loosened)} syncing (gated at a doubling where both sides sync)" if loosened else ""
        return text + (f"; {uncompared} not compared" if uncompared else "")

    # -- the whole proof --------------------------------------------------------------------
    def prepare(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        has_benchmark = subprocess.run([self.python, "-c", "import pytest_benchmark"], capture_output=True).returncode == 0
        self.benchmark_flag = ["--benchmark-disable"] if has_benchmark else []
        self.say(f"against-proof: tools/against_proof/run.sh {self.out} {' '.join(self.groups)}")
        self.say(f"date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
        self.say(f"device: {self.device_line()}")
        self.say(f"host: {socket.gethostname()}; python: {self.python}")
        if self.no_plots is not None:
            (self.no_plots / "matplotlib").mkdir(parents=True, exist_ok=True)
            (self.no_plots / "matplotlib" / "__init__.py").write_text(
                'raise ImportError("tools/against_proof skips the report\'s plots (PLOTS=1 draws them)")\n')
        self.copy_tree()
        self.make_versions()
        self.pip_install_editable(self.repo)
        self.installed_scratch = True
        if self.git_mode:
            self.say(f"source: {SRC}, copied to {self.repo}, git init there, committed as base {self.base[:10]}; "
                     f"slow {self.slow[:10]} = base + triton_flash's forward doing extra work "
                     "(implementations/triton_flash/adapter.py, extra_work.py from tools/gate_proof/site/slowable_kernels.py); "
                     "REV = base's sha")
        else:
            why = "REV_MODE=path" if shutil.which("git") else "no git on this machine"
            self.say(f"source: {SRC}, copied to {self.repo} and to {self.base} ({why}: REV is that copy, given as a "
                     "checkout path); slow = the working tree with triton_flash's forward doing extra work "
                     "(implementations/triton_flash/adapter.py, extra_work.py from tools/gate_proof/site/slowable_kernels.py)")
        self.say(f"installed editable for the runs: {self.repo} (the current side of each run is its working tree)")
        threshold = (f"--attnkit-threshold={self.threshold} (the stored gate)" if self.threshold else
                     "each gate's default: the A/B gate 2% (--attnkit-against-threshold), the stored gate 8%; "
                     "a doubling on the CPU")
        self.say(f"thresholds: {threshold}; 'at its default 8% (derived)' rereads the same stored-gate "
                 "decision at 8% (ratio past max(8%, its raised threshold) and Mann-Whitney p < 0.01)")
        for kind in ("clean", "plain", "slow"):
            self.say(f"{kind} command: " + " ".join(_quote(part) for part in self.command(kind, Path("REPORT"))))
        if "torch_sdpa" not in self.slow_impls.split(","):
            self.say("slowed runs time no reference (torch_sdpa): their stored gate has no machine factor (1.000)")
        self.say("per run: A/B verdicts (new/old: the median pair's ratio) and the stored gate's, read from the "
                 "run's report JSON; wall: the whole pytest command")

    def prove(self) -> None:
        groups = [parse_group(group) for group in self.groups]  # a typo ends the proof before any setup
        self.prepare()
        stopped = False
        for name, extra, count, given in groups:
            done_before = len([r for r in self.runs if r["group"] == name])
            for index in range(done_before + 1, done_before + count + 1):
                elapsed, estimate = time.time() - self.start, self.estimate(name, given)
                if self.deadline is not None and self.runs and elapsed + estimate > self.deadline:
                    self.say(f"not started: {name}-{index} and the rest ({elapsed:.0f} s gone; a run of up to "
                             f"{estimate:.0f} s would end after DEADLINE_S={self.deadline:g} s)")
                    stopped = True
                    break
                self.run(name, extra, index)
            if stopped:
                break
        self.totals()

    def totals(self) -> None:
        self.say("")
        for name in dict.fromkeys(r["group"] for r in self.runs):
            runs = [r for r in self.runs if r["group"] == name and r["report"]]
            broken = len([r for r in self.runs if r["group"] == name and not r["report"]])
            kind = runs[0]["kind"] if runs else "?"
            line = f"total {name}:"
            mine = (lambda d: d["impl"] == SLOWED_IMPL) if kind == "slow" else (lambda d: True)
            if kind in ("slow", "clean"):
                cases = [[e for e in r["ab"] if mine(e) and e["verdict"] != "not compared"] for r in runs]
                flagged_runs = [c for c in cases if any(_gated_regression(e) for e in c)]
                flagged = sum(len([e for e in c if _gated_regression(e)]) for c in cases)
                ratios = [e["ratio"] for c in cases for e in c]
                if kind == "slow":
                    head = f" A/B caught the slowdown in {len(flagged_runs)} of {len(runs)} runs ({SLOWED_IMPL} cases"
                else:
                    head = f" A/B runs reporting a regression {len(flagged_runs)} of {len(runs)} (cases"
                line += (f"{head} flagged {flagged} of {sum(map(len, cases))}"
                         + (f", new/old {min(ratios):.3f}-{max(ratios):.3f}" if ratios else "") + ");")
            gated = [r for r in runs if r["baseline"]]
            if gated:
                at_t = [len([d for d in r["stored_flagged"] if mine(d)]) for r in gated]
                at_8 = [len([d for d in r["stored_default_flagged"] if mine(d)]) for r in gated]
                of = sum(len([d for d in r["gate"] if mine(d)]) for r in gated)
                what = f"{SLOWED_IMPL} " if kind == "slow" else ""
                line += (f" stored gate ({what}cases) at the run's threshold: runs flagged {sum(n > 0 for n in at_t)} of "
                         f"{len(gated)}, cases {sum(at_t)} of {of}; at its default 8% (derived): runs "
                         f"{sum(n > 0 for n in at_8)}, cases {sum(at_8)};")
            else:
                line += " stored gate: no baseline file for this device;"
            walls = [r["wall"] for r in runs]
            if walls:
                line += f" wall {min(walls):.0f}-{max(walls):.0f} s"
            if broken:
                line += f"; {broken} run(s) wrote no report"
            self.say(line)
        self.wall_ratio()
        self.calibration_lines()
        self.say(f"wall time: {time.time() - self.start:.0f} s")

    def wall_ratio(self) -> None:
        """A/B against plain on the same selection, both with the current side's Triton cache warm:
        the first pytest run of a call (cold caches) counts for neither."""
        plain = [r["wall"] for r in self.runs if r["kind"] == "plain" and not r["first"] and r["report"]]
        ab = [r["wall"] for r in self.runs if r["kind"] == "clean" and not r["first"] and r["report"]]
        if plain and ab:
            ratio = statistics.median(ab) / statistics.median(plain)
            self.say(f"wall time, the same selection: A/B {statistics.median(ab):.0f} s (median of {len(ab)} clean "
                     f"runs) against plain {statistics.median(plain):.0f} s (median of {len(plain)}): ratio "
                     f"{ratio:.2f}x (issue 20 asks at most 2.2x; the first run of the call, with cold caches, is "
                     "left out of both)")
        elif any(r["kind"] == "plain" for r in self.runs):
            self.say("wall time ratio: not computed (a plain run and a clean run, neither the call's first, are needed)")

    def calibration_lines(self) -> None:
        if not self.calibration.exists():
            if any(r["kind"] == "slow" for r in self.runs):
                self.say("calibrated extra work: none logged (on the CPU the extra work is a share of the rows, "
                         "uncalibrated)")
            return
        self.say("calibrated extra work (once per shape and share, reused by every later run; measured then):")
        for line in self.calibration.read_text(encoding="utf-8").splitlines():
            e = json.loads(line)
            attempts = ", ".join(f"{a['rows']}x{a['keys']} {100 * a['measured_slowdown']:+.1f}%" for a in e["attempts"])
            self.say(f"  extra {e['extra']:.2f} q{e['q']} k{e['k']}: {e['rows']} of {e['of_rows']} rows against "
                     f"{e['keys']} of {e['of_keys']} keys, kernel {e['kernel_ms']:.4f} ms, measured "
                     f"{100 * e['measured_slowdown']:+.1f}% (attempts, rows x keys: {attempts})")

    def close(self) -> None:
        if self.installed_scratch:
            try:
                self.pip_install_editable(SRC)
                self.say(f"reinstalled editable: {SRC}")
            except SystemExit as error:
                self.say(f"could NOT reinstall {SRC} editable: {error}")
        if os.environ.get("KEEP_SCRATCH"):
            self.say(f"scratch kept: {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)


def parse_group(group: str) -> tuple[str, float, int, float | None]:
    """NAME:EXTRA:RUNS[:SECONDS]: SECONDS, what one run may take before one has run in this call."""
    try:
        name, extra, count, *given = group.split(":")
        if not name or len(given) > 1:
            raise ValueError
        return name, float(extra), int(count), float(given[0]) if given else None
    except ValueError:
        raise SystemExit(f"against-proof: bad group {group!r}: NAME:EXTRA:RUNS[:SECONDS], e.g. slower5:0.05:10 "
                         "or clean:0:2:180") from None


def _gated_regression(entry: dict) -> bool:
    """An A/B regression that failed the run. In the runs of results/2026-11-23-h200-against-proof
    a case where either side synced was shown and not gated (its entry's "ungated"); the gate now
    gates such a case (at a doubling where both sides sync), and every regression it reports counts."""
    return entry["verdict"] == "regression" and not entry.get("ungated")


def _regression(decision: dict, threshold: float) -> bool:
    return decision["p_slower"] < ALPHA and decision["ratio"] > 1 + threshold


def _short(entry: dict) -> str:
    """A case as ``fwd q4096-d128``: the mode, the length and the head dim (the batch follows them)."""
    parts = entry["case"].split("-")
    keep = [part for part in parts if part[0] in "qd" and part[1:2].isdigit()]
    mode = {"forward": "fwd", "backward": "bwd"}.get(entry["mode"], entry["mode"])
    return f"{mode} {'-'.join(keep) or entry['case']}"


def _names(entries: list[dict]) -> str:
    if not entries:
        return ""
    return " (" + ", ".join(f"{e['impl']} {_short(e)} {e['ratio']:.3f}" for e in entries) + ")"


def _quote(part: str) -> str:
    return f"'{part}'" if any(ch in part for ch in " ()*") else part


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the proof as Ctrl-C does: totals so far, then the reinstall


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: tools/against_proof/run.sh OUT [NAME:EXTRA:RUNS...]")
    proof = Proof(Path(sys.argv[1]).resolve(), sys.argv[2:] or DEFAULT_GROUPS)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        proof.prove()
    except KeyboardInterrupt:
        proof.say("interrupted")
        proof.totals()
    except SystemExit as error:  # a setup step failed: the reason goes into the summary too
        if error.code not in (None, 0):
            proof.say(str(error.code))
        raise
    finally:
        proof.close()


if __name__ == "__main__":
    main()
