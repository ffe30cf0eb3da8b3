"""--attnkit-against=REV on the CPU: a git repository made inside the test, two commits of a tiny
package whose second commit does five times the work, and the current version of the package made
importable through a fake distribution (installing it would take longer than the whole test).

Each test proves one thing about the plumbing: that ``<impl>@<rev>`` is timed from REV's code and
not the current one, that the A/B table shows the ratio and the verdict, that a 5x slowdown fails
the run while identical code passes, and that a REV that cannot be had is a usage error."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from helpers import said

# The A/B gate times on this CPU: run with no other test beside it (tests/alone.py).
pytestmark = pytest.mark.timing

ARGS = ("--attnkit", "--attnkit-suite=speed", "--attnkit-impl=tiny", "--attnkit-device=cpu", "--attnkit-budget-ms=60",
        "--attnkit-baseline-dir=bl", "--benchmark-disable", "-p", "no:cacheprovider", "-k", "speed_forward and not causal")


def kernel_source(repeat: int) -> str:
    return textwrap.dedent(f'''
        import torch

        REPEAT = {repeat}

        def attn(q, k, v, *, causal=False, scale=None):
            """Plain attention, computed REPEAT times: real work, so a slower version is slower."""
            scale = q.shape[-1] ** -0.5 if scale is None else scale
            for _ in range(REPEAT):
                out = torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v
            return out
        ''')


PYPROJECT = textwrap.dedent('''
    [build-system]
    requires = ["setuptools>=64"]
    build-backend = "setuptools.build_meta"

    [project]
    name = "tinyattn"
    version = "0.1.0"

    [project.entry-points."attnkit.implementations"]
    tiny = "tinyattn:attn"

    [tool.setuptools]
    packages = ["tinyattn"]
    ''')


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repository(pytester: pytest.Pytester) -> dict[str, str]:
    """pytester's folder as a git repository: a fast commit, then one with five times the work."""
    root = pytester.path
    pytester.makeini("[pytest]\n")
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "tinyattn").mkdir()
    git(root, "init", "-q")
    git(root, "config", "user.email", "test@example.com")
    git(root, "config", "user.name", "test")
    commits = {}
    for label, repeat in (("fast", 3), ("slow", 15)):
        (root / "tinyattn" / "__init__.py").write_text(kernel_source(repeat))
        git(root, "add", "pyproject.toml", "tinyattn/__init__.py", "tox.ini")
        git(root, "commit", "-q", "-m", f"{label} kernel")
        commits[label] = git(root, "rev-parse", "HEAD")
    return commits


def current_version(fake_dist, repeat: int) -> None:
    """The version under test, importable as ``tinyattn`` through a fake distribution."""
    fake_dist({"tiny": "tinyattn:attn"}, extra_modules={"tinyattn": kernel_source(repeat)})


def report(pytester: pytest.Pytester) -> dict:
    return json.loads((pytester.path / "rep" / "attnkit-report.json").read_text())


def test_the_revision_is_timed_from_its_own_code(pytester: pytest.Pytester, repository, fake_dist) -> None:
    current_version(fake_dist, repeat=3)
    result = pytester.runpytest(*ARGS, f"--attnkit-against={repository['slow']}", "--attnkit-report=rep")
    short = repository["slow"][:10]
    result.assert_outcomes(passed=2)  # tiny, and tiny@<sha> reporting its half of the pair
    result.stdout.fnmatch_lines([f"attnkit: gate: A/B against {short}, interleaved and paired (tiny@{short}); stored baseline:",
                                 "*attnkit A/B against*",
                                 "implementation*mode*case*old ms*new/old*99% interval*verdict",
                                 "tiny * fwd * b1-h2-q256-k256-d64-fp32 * 0.* *"])
    document = report(pytester)
    medians = {m["impl"]: m["timing"]["median_ms"] for m in document["speed"]["measurements"]}
    assert medians[f"tiny@{short}"] > 2.5 * medians["tiny"]  # REV's five-fold work, not the current code
    [entry] = document["ab"]
    # A loaded CPU can starve whole blocks, so the verdict may stay "unchanged"; the ratio cannot.
    assert entry["against"] == f"tiny@{short}" and entry["verdict"] in ("improvement", "unchanged")
    assert entry["pairs"] >= 8 and entry["low"] <= entry["ratio"] <= entry["high"] and entry["ratio"] < 0.5
    assert document["against"]["kind"] == "git"
    assert not git(pytester.path, "worktree", "list").count("\n")  # the worktree is gone again
    assert "tinyattn" not in {path.name for path in (pytester.path / "bl").glob("*")}


def test_a_five_fold_slowdown_fails_the_run(pytester: pytest.Pytester, repository, fake_dist) -> None:
    current_version(fake_dist, repeat=15)
    result = pytester.runpytest(*ARGS, f"--attnkit-against={repository['fast']}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, failed=1)
    assert said(result, "tiny regressed against tiny@* on b1-h2-q256-k256-d64-fp32 (forward): median * ms -> "
                        "* ms, new/old "), result.stdout.str()
    result.stdout.fnmatch_lines(["tiny * fwd * b1-h2-q256-k256-d64-fp32 * REGRESSION"])


def test_identical_code_passes(pytester: pytest.Pytester, repository, fake_dist) -> None:
    current_version(fake_dist, repeat=3)
    result = pytester.runpytest(*ARGS, f"--attnkit-against={repository['fast'][:8]}")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["tiny * fwd * b1-h2-q256-k256-d64-fp32 * unchanged"])


def test_a_revision_that_cannot_be_had_is_a_usage_error(pytester: pytest.Pytester, repository, fake_dist) -> None:
    current_version(fake_dist, repeat=3)
    result = pytester.runpytest(*ARGS, "--attnkit-against=no-such-branch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--attnkit-against=no-such-branch: the other version could not be materialised: "
                                 "'no-such-branch' is neither a path nor a revision of the git repository *"
                                 "(command line --attnkit-against); nothing was gated against it*"])


def test_a_revision_whose_kernels_do_not_load_is_a_usage_error(pytester: pytest.Pytester, repository,
                                                                 fake_dist) -> None:
    current_version(fake_dist, repeat=3)
    (pytester.path / "tinyattn" / "__init__.py").write_text("raise ImportError('this version is broken')\n")
    git(pytester.path, "commit", "-q", "-am", "broken")
    result = pytester.runpytest(*ARGS, "--attnkit-against=HEAD")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*the other version's implementations could not be loaded: tiny@HEAD *"
                                 "ImportError: this version is broken*"])


def test_an_implementation_inside_the_harness_package_is_taken_from_the_revision(tmp_path: Path) -> None:
    """This project's own kernels live in pytest_attnkit.implementations, under the harness's
    package: REV's must still be the ones loaded, beside the current harness (in a subprocess, so
    this process's modules stay as they are)."""
    import sys

    package = tmp_path / "pytest_attnkit" / "implementations"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "torch_sdpa.py").write_text("def attn(q, k, v, *, causal=False, scale=None):\n    return 'rev'\n")
    script = textwrap.dedent(f'''
        import sys
        from pytest_attnkit.worker.revision import take_from_revision
        import pytest_attnkit.contract
        sys.path.insert(0, {str(tmp_path)!r})
        take_from_revision({str(tmp_path)!r}, "pytest_attnkit.implementations.torch_sdpa:attn")
        from pytest_attnkit.registry import load_implementation
        impl = load_implementation("torch_sdpa@rev", "pytest_attnkit.implementations.torch_sdpa:attn")
        print(impl.fn(1, 2, 3) if hasattr(impl, "fn") else sys.modules["pytest_attnkit.implementations.torch_sdpa"].attn(1, 2, 3))
        print(sys.modules["pytest_attnkit.implementations.torch_sdpa"].__file__.startswith({str(tmp_path)!r}))
        print(pytest_attnkit.contract.__file__.startswith({str(tmp_path)!r}))
        ''')
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert output == ["rev", "True", "False"]


def test_the_revision_starts_from_a_copy_of_the_triton_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """REV's cache is its own folder, seeded with hard links: a shared kernel need not compile again."""
    from pytest_attnkit.controller.against import _seed_triton_cache

    current = tmp_path / "current"
    (current / "abc123").mkdir(parents=True)
    (current / "abc123" / "kernel.cubin").write_bytes(b"compiled")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(current))
    _seed_triton_cache(tmp_path / "rev")
    copied = tmp_path / "rev" / "abc123" / "kernel.cubin"
    assert copied.read_bytes() == b"compiled"
    assert copied.stat().st_ino == (current / "abc123" / "kernel.cubin").stat().st_ino
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "missing"))
    _seed_triton_cache(tmp_path / "rev2")  # nothing to copy: no error, no folder
    assert not (tmp_path / "rev2").exists()
