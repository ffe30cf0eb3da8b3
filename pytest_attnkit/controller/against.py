"""The other version of an A/B run (``--attnkit-against=REV``): materialised out of place.

REV is a git revision of the repository that holds the config file (or the current folder), a
path to another checkout, or a path to a wheel or an sdist. Whatever it is, it is installed with
``pip install --no-deps`` into a private folder (its *site*) under a temporary directory: a
revision is first checked out with ``git worktree add --detach`` there, and the worktree is
removed again at the end; a wheel is simply unzipped. Nothing in the user's checkout or
environment changes.

Its implementations are REV's own: the ``attnkit.implementations`` entry points of the
distributions installed in the site (``importlib.metadata.distributions(path=[site])``), so a
third-party package's kernels are compared with their own previous version, whatever is
installed now. Each is named ``<impl>@<label>`` (the revision as given; a short sha for a git
revision given as one) and loaded in a worker of its own, with the site first on its sys.path
(:mod:`pytest_attnkit.worker.revision`) and its own Triton and Inductor caches. REV's Triton cache
starts as a copy (hard links) of the current one: Triton keys each compiled kernel by its source
and options, so a kernel REV shares with the current version is found there, and one it changed
compiles anew; without the copy every A/B run recompiled every kernel of REV (tens of seconds).

Every way this can fail raises :class:`AgainstError` with the command and its output, which
:func:`materialise_for` turns into a usage error (exit code 4), as it does a REV with none of the
selected implementations, and :func:`check_loaded` one whose implementations cannot be loaded: an
A/B run that cannot build the other side gates nothing, and must not look as if it passed.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import pytest

from pytest_attnkit.registry import GROUP, EntryPointRef

if TYPE_CHECKING:
    from pytest_attnkit.controller.impls import ImplInfo
    from pytest_attnkit.controller.options import Settings

OUTPUT_TAIL_CHARS = 2000
ARCHIVES = (".whl", ".tar.gz", ".tgz", ".zip")


class AgainstError(Exception):
    """REV could not be found, checked out, built or read."""


@dataclass
class Revision:
    """REV, materialised: where it is installed and what it registers."""

    given: str
    label: str  # what the names carry after the @
    kind: str  # "git", "checkout", "wheel" or "sdist"
    description: str  # for the header: the sha and where it came from
    root: Path  # the temporary folder holding everything below
    site: Path
    refs: list[EntryPointRef] = field(default_factory=list)
    #: base implementation name -> its counterpart's name (``<impl>@<label>``); the report's
    #: ``against.twins`` (the key kept for reports already written)
    counterparts: dict[str, str] = field(default_factory=dict)
    _worktree: tuple[Path, Path] | None = None  # (repository, worktree) to remove at the end

    def worker_setup(self) -> dict[str, object]:
        """What a counterpart's worker starts with: the site first on sys.path, caches of its own."""
        return {"init": {"sys_path_first": [str(self.site)], "revision_site": str(self.site)},
                "env": {"TRITON_CACHE_DIR": str(self.root / "triton-cache"),
                        "TORCHINDUCTOR_CACHE_DIR": str(self.root / "inductor-cache")}}

    def close(self) -> None:
        if self._worktree is not None:
            repository, worktree = self._worktree
            _run(["git", "-C", str(repository), "worktree", "remove", "--force", str(worktree)], check=False)
            _run(["git", "-C", str(repository), "worktree", "prune"], check=False)
            self._worktree = None
        shutil.rmtree(self.root, ignore_errors=True)


def _run(command: list[str], *, check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    try:
        completed = subprocess.run(command, capture_output=True, text=True, cwd=cwd)
    except OSError as error:
        raise AgainstError(f"could not run {command[0]}: {error}") from None
    if check and completed.returncode != 0:
        output = (completed.stdout + completed.stderr).strip()[-OUTPUT_TAIL_CHARS:]
        raise AgainstError(f"`{' '.join(command)}` exited with code {completed.returncode}:\n{output}")
    return completed


def materialise(given: str, repository: Path, invocation_dir: Path) -> Revision:
    """Install REV into a temporary site and read its implementations; raises AgainstError."""
    root = Path(tempfile.mkdtemp(prefix="attnkit-against-"))
    try:
        revision = _materialise(given.strip(), repository, invocation_dir, root)
        revision.refs = _entry_points(revision)
        _seed_triton_cache(root / "triton-cache")
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return revision


def _materialise(given: str, repository: Path, invocation_dir: Path, root: Path) -> Revision:
    site = root / "site"
    path = (invocation_dir / given).expanduser()
    if path.exists():
        if path.is_dir():
            _pip_install(path, site)
            return Revision(given, path.name, "checkout", f"the checkout {path}", root, site)
        if path.name.endswith(".whl"):
            try:
                with zipfile.ZipFile(path) as wheel:
                    wheel.extractall(site)
            except (OSError, zipfile.BadZipFile) as error:
                raise AgainstError(f"the wheel {path} could not be unpacked: {error}") from None
            return Revision(given, _archive_label(path), "wheel", f"the wheel {path}", root, site)
        if path.name.endswith(ARCHIVES):
            _pip_install(path, site)
            return Revision(given, _archive_label(path), "sdist", f"the sdist {path}", root, site)
        raise AgainstError(f"{path} is a file but not a wheel or an sdist ({', '.join(ARCHIVES)})")
    top = _run(["git", "-C", str(repository), "rev-parse", "--show-toplevel"], check=False)
    if top.returncode != 0:
        raise AgainstError(f"{given!r} is not a path, and {repository} is not in a git repository to find it "
                           f"as a revision in ({top.stderr.strip()})")
    repo = Path(top.stdout.strip())
    parsed = _run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{given}^{{commit}}"], check=False)
    if parsed.returncode != 0:
        raise AgainstError(f"{given!r} is neither a path nor a revision of the git repository {repo} "
                           "(in CI, check out with the full history: actions/checkout with fetch-depth: 0)")
    sha = parsed.stdout.strip()
    worktree = root / "src"
    _run(["git", "-C", str(repo), "worktree", "add", "--detach", str(worktree), sha])
    label = sha[:10] if re.fullmatch(r"[0-9a-fA-F]{7,40}", given) else given
    description = label if label == sha[:10] else f"{given} ({sha[:10]})"
    revision = Revision(given, label, "git", description, root, site)
    revision._worktree = (repo, worktree)
    try:
        subdir = worktree / (repository.resolve().relative_to(repo.resolve()) if repository.resolve() != repo.resolve() else "")
        source = next((folder for folder in (subdir, *subdir.parents) if (folder / "pyproject.toml").exists()
                       or (folder / "setup.py").exists()), None)
        if source is None or worktree not in (source, *source.parents):
            raise AgainstError(f"{given} ({sha[:10]}) has no pyproject.toml or setup.py at {subdir} or above it "
                               "in the repository: nothing to install")
        _pip_install(source, site)
    except BaseException:
        revision.close()
        raise
    return revision


#: Across file systems (no hard links) REV's Triton cache is seeded only from a cache this small.
SEED_COPY_LIMIT = 512 * 2**20


def triton_cache_dir() -> Path:
    """Where the current version's workers keep Triton's compiled kernels (Triton's own default)."""
    configured = os.environ.get("TRITON_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path(os.environ.get("TRITON_HOME") or Path.home()) / ".triton" / "cache"


def _seed_triton_cache(target: Path) -> None:
    """Start REV's Triton cache as hard links to the current one's files (copies across file
    systems, up to ``SEED_COPY_LIMIT``). Triton writes a cache entry to a temporary file and renames it into place, so
    neither side's writes reach the other's files. Nothing to copy is not an error."""
    source = triton_cache_dir()
    if not source.is_dir():
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        same_device = source.stat().st_dev == target.parent.stat().st_dev
        if not same_device and sum(f.stat().st_size for f in source.rglob("*") if f.is_file()) > SEED_COPY_LIMIT:
            return  # a copy across file systems would cost more than the compilations it saves
    except OSError:
        return

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    try:
        shutil.copytree(source, target, copy_function=link, dirs_exist_ok=True)
    except (OSError, shutil.Error):
        pass  # a partial copy only costs compilations


def _archive_label(path: Path) -> str:
    name = path.name
    for suffix in ARCHIVES:
        name = name.removesuffix(suffix)
    parts = name.split("-")
    return parts[1] if len(parts) > 1 else name


def _pip_install(source: Path, site: Path) -> None:
    """A non-editable install of ``source`` into ``site`` alone: REV's packages as its metadata
    maps them (a package dir mapping included), and its entry points in ``*.dist-info``."""
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
          "--disable-pip-version-check", "--no-input", "--target", str(site), str(source)])


def _entry_points(revision: Revision) -> list[EntryPointRef]:
    refs = []
    for distribution in importlib.metadata.distributions(path=[str(revision.site)]):
        for entry_point in distribution.entry_points:
            if entry_point.group == GROUP:
                refs.append(EntryPointRef(f"{entry_point.name}@{revision.label}", entry_point.value,
                                          f"{distribution.metadata['Name']} at {revision.given}"))
    if not refs:
        raise AgainstError(f"{revision.description} registers no implementations: its distributions in "
                           f"{revision.site} have no {GROUP!r} entry points")
    return sorted(refs, key=lambda ref: ref.name)


def counterparts_of(revision: Revision, selected: list[str]) -> list[EntryPointRef]:
    """REV's implementations that have a counterpart among the ``selected`` current ones; records
    which is whose in ``revision.counterparts``."""
    chosen = []
    for ref in revision.refs:
        base = ref.name.rsplit("@", 1)[0]
        if base in selected:
            revision.counterparts[base] = ref.name
            chosen.append(ref)
    return chosen


def _usage_error(settings: "Settings", problem: str) -> pytest.UsageError:
    return pytest.UsageError(f"attnkit: {problem} ({settings.sources.get('against')}); nothing was gated against it")


def materialise_for(settings: "Settings", selected: list[str]) -> tuple[Revision | None, list[EntryPointRef]]:
    """--attnkit-against's REV, materialised, and its counterparts of the ``selected`` current
    implementations ((None, []) without the option). A usage error where it cannot run: without
    the speed suite, in-process, REV not materialised, or none of the selected in REV (REV is
    removed again then)."""
    if not settings.against:
        return None, []
    given = settings.against
    if "speed" not in settings.suite:
        raise _usage_error(settings, f"--attnkit-against={given} compares speed, and the speed suite is not selected")
    if settings.inprocess:
        raise _usage_error(settings, f"--attnkit-against={given} loads another version's kernels in workers of "
                                     "their own; it cannot run with --attnkit-inprocess")
    try:
        revision = materialise(given, settings.config_dir, settings.invocation_dir)
    except AgainstError as error:
        raise _usage_error(settings, f"--attnkit-against={given}: the other version could not be materialised: "
                                     f"{error}") from None
    counterparts = counterparts_of(revision, selected)
    if not counterparts:
        revision.close()
        raise _usage_error(settings, f"--attnkit-against={given}: none of the selected implementations "
                                     f"({', '.join(selected) or 'none'}) exists in {revision.description} (it registers "
                                     f"{', '.join(ref.name for ref in revision.refs)})")
    return revision, counterparts


def check_loaded(settings: "Settings", infos: Iterable["ImplInfo"]) -> None:
    """A usage error naming each of REV's implementations (``infos``: as its worker described
    it) that could not be loaded."""
    broken = [info for info in infos if info.load_error]
    if broken:
        details = "; ".join(f"{info.name} ({info.origin}): "
                            f"{((info.load_error or '').strip().splitlines() or ['?'])[-1]}" for info in broken)
        raise _usage_error(settings, f"--attnkit-against={settings.against}: the other version's "
                                     f"implementations could not be loaded: {details}")


def counterpart_names(revision: Revision | None) -> set[str]:
    """REV's implementations of this run (``<impl>@<label>``): they take part in the speed suite only."""
    return set(revision.counterparts.values()) if revision else set()


def report_state(revision: Revision | None) -> dict[str, Any] | None:
    """The report's ``against``: REV as given and as materialised, and each counterpart."""
    if revision is None:
        return None
    return {"given": revision.given, "label": revision.label, "kind": revision.kind,
            "description": revision.description,
            "twins": dict(revision.counterparts)}  # the key reports already written use
