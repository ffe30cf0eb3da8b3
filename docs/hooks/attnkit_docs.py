"""The documentation's generator: an MkDocs hook (``mkdocs.yml``: ``hooks``) that fills the pages'
reference parts from the code at every build, and checks their links into the repository.

A page asks for a generated part with a marker on a line of its own:

- ``<!-- attnkit:options -->``: every ``--attnkit...`` flag and ``attnkit_...`` ini option, as
  ``pytest_attnkit.controller.options.add_options`` gives them to pytest (with the environment
  variable, ini name and default of each of ``SETTINGS``);
- ``<!-- attnkit:declarations -->``: the class attributes of ``AttentionImpl`` in source order,
  with their defaults, the ``#:`` comment above each (Sphinx autodoc's convention) and the words
  ``not_supported_reasons`` or ``unavailable_reason`` skip a case with when the attribute says no;
  then its methods with their docstrings;
- ``<!-- attnkit:constants -->``: the contract module's named constants and their ``#:`` comments;
- ``<!-- attnkit:fields CLASS -->``: the fields of a dataclass of the contract (``Case``,
  ``AccuracyBudget``) with their defaults;
- ``<!-- attnkit:hooks -->``: the extension hooks of ``pytest_attnkit.hookspecs``, with their
  docstrings and examples;
- ``<!-- attnkit:readme SECTION -->``: a ``## SECTION`` of the README (its CI recipes), so that the
  recipes have one source.

Nothing here is copied from the code: an attribute, option or hook added later appears at the
next build. ``tests/e2e/test_docs.py`` renders the same parts and compares them with ``pytest
--help`` and with the classes themselves.

A link that leaves ``docs/`` for a file of the repository (``[results/README.md](../results/README.md)``)
works where the Markdown is read in the repository (a forge, an editor). The build checks that
its target exists (a missing one is a warning, so ``mkdocs build --strict`` fails) and renders it
as a link to the forge when ``mkdocs.yml`` sets ``repo_url``, else as the path in code font.

The module imports no MkDocs code, so the tests can use it without MkDocs installed.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import html
import inspect
import logging
import re
import textwrap
from pathlib import Path
from typing import Any, Callable

DOCS = Path(__file__).resolve().parents[1]
REPO = DOCS.parent

log = logging.getLogger("mkdocs.hooks.attnkit_docs")

MARKER = re.compile(r"^<!-- attnkit:(?P<name>[a-z]+)(?: (?P<argument>[^>]*?))? -->[ \t]*$", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)


# -- Markdown helpers --------------------------------------------------------------------------


def cell(text: str) -> str:
    """Plain text (an option's help) for a Markdown table cell: on one line, HTML-escaped, with
    Markdown's markup characters escaped."""
    text = html.escape(" ".join(str(text).split()), quote=False)
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", text)


def code(text: str) -> str:
    """Inline code that holds any text; in a table cell too, since Python-Markdown's tables leave
    the pipes inside code spans alone."""
    text = " ".join(str(text).split())
    return f"`` {text} ``" if "`" in text else f"`{text}`"


CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def markdown_cell(markdown: str) -> str:
    """Markdown (with code spans) for a table cell: on one line, with pipes and angle brackets
    outside the code spans escaped."""
    markdown = " ".join(markdown.split())
    pieces, last = [], 0
    for match in CODE_SPAN.finditer(markdown):
        pieces += [html.escape(markdown[last:match.start()], quote=False).replace("|", "\\|"), match.group(0)]
        last = match.end()
    pieces.append(html.escape(markdown[last:], quote=False).replace("|", "\\|"))
    return "".join(pieces)


def rst_to_markdown(text: str) -> str:
    """The reStructuredText of the code's docstrings and comments, as Markdown: double-backquoted
    literals and Sphinx roles (``:class:`~a.B```) become code spans, and a paragraph that ends in
    ``::`` before an indented block becomes a paragraph and a fenced Python block."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", lambda m: f"`{m.group(1).split('.')[-1] if '~' in m.group(0) else m.group(1)}`",
                  text)
    text = re.sub(r"``(.+?)``", r"`\1`", text)
    out: list[str] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.rstrip().endswith("::"):
            stripped = line.rstrip()[:-2].rstrip()
            out.append(stripped + (":" if stripped and not stripped.endswith(":") else ""))
            index += 1
            block: list[str] = []
            while index < len(lines) and (not lines[index].strip() or lines[index].startswith((" ", "\t"))):
                block.append(lines[index])
                index += 1
            while block and not block[-1].strip():
                block.pop()
            out += ["", "```python", *textwrap.dedent("\n".join(block)).strip("\n").splitlines(), "```", ""]
            continue
        out.append(line)
        index += 1
    return "\n".join(out).strip()


def one_paragraph(text: str) -> str:
    return " ".join(rst_to_markdown(text).split())


# -- the options -------------------------------------------------------------------------------


@dataclasses.dataclass
class OptionRow:
    """One option as pytest gets it: a flag (with its environment and ini forms) or an ini line."""

    flag: str | None
    metavar: str | None
    env: str | None
    ini: str | None
    ini_type: str | None
    default: str
    help: str


class _Recorder:
    """Stands in for pytest's parser and option group, and keeps what ``add_options`` adds."""

    def __init__(self) -> None:
        self.options: list[tuple[tuple[str, ...], dict[str, Any]]] = []
        self.inis: list[tuple[str, dict[str, Any]]] = []

    def getgroup(self, name: str, description: str = "") -> "_Recorder":
        return self

    def addoption(self, *names: str, **attributes: Any) -> None:
        self.options.append((names, attributes))

    def addini(self, name: str, help: str, type: str | None = None, default: Any = None) -> None:
        self.inis.append((name, {"help": help, "type": type or "string", "default": default}))


def _default_text(value: Any, metavar: str | None) -> str:
    if value is False:
        return "off"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) if value else "unset"
    if value in ("", None):
        return "unset"
    if metavar == "PERCENT" and isinstance(value, float):
        return f"{value * 100:g}%"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def option_rows() -> list[OptionRow]:
    """Every option the plugin adds, in the order ``pytest --help`` lists them, then the ini
    lines that have no flag."""
    from pytest_attnkit.controller.options import SETTINGS, add_options

    recorder = _Recorder()
    add_options(recorder)  # type: ignore[arg-type]
    settings = {f"attnkit_{setting.dest}": setting for setting in SETTINGS}
    rows: list[OptionRow] = []
    for names, attributes in recorder.options:
        flag = next(name for name in names if name.startswith("--"))
        setting = settings.get(attributes.get("dest", ""))
        if setting is not None:
            rows.append(OptionRow(flag, setting.metavar, setting.env, setting.ini, "string",
                                  _default_text(setting.default, setting.metavar), setting.help.replace("%%", "%")))
        else:
            rows.append(OptionRow(flag, attributes.get("metavar"), None, None, None,
                                  _default_text(attributes.get("default"), attributes.get("metavar")),
                                  str(attributes.get("help", "")).replace("%%", "%")))
    covered = {row.ini for row in rows}
    for name, attributes in recorder.inis:
        if name not in covered:
            rows.append(OptionRow(None, None, None, name, attributes["type"],
                                  _default_text(attributes["default"], None), attributes["help"]))
    return rows


def options_markdown() -> str:
    lines = ["| option | environment | ini | default | meaning |", "|---|---|---|---|---|"]
    for row in option_rows():
        flag = code(f"{row.flag}={row.metavar}" if row.metavar else row.flag) if row.flag else ""
        ini = code(row.ini) + (f" ({row.ini_type})" if row.ini_type not in (None, "string") else "") if row.ini else ""
        lines.append(f"| {flag} | {code(row.env) if row.env else ''} | {ini} | {cell(row.default)} | "
                     f"{cell(row.help)} |")
    return "\n".join(lines)


# -- the contract ------------------------------------------------------------------------------


def _comment_above(source_lines: list[str], lineno: int) -> str:
    """The ``#:`` comment lines right above line ``lineno`` (1-based), joined."""
    comment: list[str] = []
    index = lineno - 2
    while index >= 0 and source_lines[index].strip().startswith("#:"):
        comment.insert(0, source_lines[index].strip()[2:].strip())
        index -= 1
    return " ".join(comment)


def _annotation(node: ast.AST | None) -> str:
    if node is None:
        return ""
    text = ast.unparse(node).strip("'\"")
    match = re.fullmatch(r"ClassVar\[(.*)\]", text)
    return (match.group(1) if match else text).strip("'\"")


@dataclasses.dataclass
class Declaration:
    name: str
    annotation: str
    default: Any
    default_source: str
    comment: str
    refusals: list[str]


def _refusals(cls: type) -> dict[str, list[str]]:
    """attribute -> the messages with which ``not_supported_reasons`` and ``unavailable_reason``
    refuse when it says no: each ``reasons.append(...)`` or ``return ...`` under an ``if`` whose
    test reads ``self.<attribute>`` (or a local name bound to it)."""
    found: dict[str, list[str]] = {}
    for method_name in ("unavailable_reason", "not_supported_reasons"):
        method = getattr(cls, method_name, None)
        if method is None:
            continue
        source = textwrap.dedent(inspect.getsource(method))
        tree = ast.parse(source)
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and isinstance(node.value, ast.Attribute) and isinstance(node.value.value, ast.Name)
                    and node.value.value.id == "self"):
                aliases[node.targets[0].id] = node.value.attr

        def attributes_read(test: ast.AST) -> list[str]:
            """The attributes a condition reads, in source order."""
            names = []
            for sub in ast.walk(test):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                    names.append((sub.col_offset, sub.attr))
                elif isinstance(sub, ast.Name) and sub.id in aliases:
                    names.append((sub.col_offset, aliases[sub.id]))
            return [name for _, name in sorted(names)]

        def messages(body: list[ast.stmt]) -> list[str]:
            texts = []
            for statement in body:
                value = None
                if (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
                        and isinstance(statement.value.func, ast.Attribute) and statement.value.func.attr == "append"
                        and statement.value.args):
                    value = statement.value.args[0]
                elif isinstance(statement, ast.Return) and statement.value is not None:
                    value = statement.value
                if value is not None:
                    texts.append(ast.get_source_segment(source, value) or ast.unparse(value))
            return texts

        for node in ast.walk(tree):
            # A condition that reads several attributes (``self.supports_paged_kv and not
            # self.supports_paged_kv_backward``) refuses on account of the last one it reads.
            if isinstance(node, ast.If) and attributes_read(node.test):
                name = attributes_read(node.test)[-1]
                for text in messages(node.body):
                    if text not in found.setdefault(name, []):
                        found[name].append(text)
    return found


def declarations(cls: type) -> list[Declaration]:
    """The public class attributes of ``cls`` (not its methods or properties), in source order,
    then any set on it otherwise, each with its ``#:`` comment."""
    source = textwrap.dedent(inspect.getsource(cls))
    source_lines = source.splitlines()
    class_node = ast.parse(source).body[0]
    assert isinstance(class_node, ast.ClassDef)
    refusals = _refusals(cls)
    seen: list[Declaration] = []
    for node in class_node.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name, annotation, value = node.target.id, node.annotation, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, annotation, value = node.targets[0].id, None, node.value
        else:
            continue
        if name.startswith("_"):
            continue
        seen.append(Declaration(name, _annotation(annotation), getattr(cls, name, None),
                                ast.get_source_segment(source, value) if value is not None else "",
                                _comment_above(source_lines, node.lineno), refusals.get(name, [])))
    names = {declaration.name for declaration in seen}
    for name, value in vars(cls).items():
        if name.startswith("_") or name in names or callable(value) or isinstance(value, (property, staticmethod,
                                                                                          classmethod)):
            continue
        seen.append(Declaration(name, "", value, "", "", refusals.get(name, [])))
    return seen


def _default_cell(declaration: Declaration) -> str:
    """The default as written in the code, and its value when the code names it (an enum member's
    value: what an implementation may declare in its place, ``MemoryClass.LINEAR`` = ``'linear'``)."""
    written = declaration.default_source
    value = declaration.default.value if isinstance(declaration.default, enum.Enum) else declaration.default
    try:
        ast.literal_eval(written)
    except (ValueError, SyntaxError):
        return f"{code(written)} = {code(repr(value))}" if written else code(repr(value))
    return code(written)


def _signature(function: Callable[..., Any]) -> str:
    return str(inspect.signature(function)).replace("'", "")


def declarations_markdown(cls: type | None = None) -> str:
    if cls is None:
        from pytest_attnkit.contract import AttentionImpl as cls
    lines = [one_paragraph(inspect.getdoc(cls) or ""), "",
             "| attribute | type | default | what the code says about it | a case it rules out is skipped with |",
             "|---|---|---|---|---|"]
    for declaration in declarations(cls):
        refusals = "<br>".join(code(text) for text in declaration.refusals)
        lines.append(f"| {code(declaration.name)} | {code(declaration.annotation) if declaration.annotation else ''} | "
                     f"{_default_cell(declaration)} | {markdown_cell(one_paragraph(declaration.comment))} | {refusals} |")
    lines += ["", "Its methods:", ""]
    for name, member in vars(cls).items():
        if name.startswith("_") or not callable(member):
            continue
        doc = inspect.getdoc(member)
        lines.append(f"- {code(name + _signature(member))}" + (f": {one_paragraph(doc)}" if doc else ""))
    return "\n".join(lines)


def constants_markdown(module: Any = None) -> str:
    """The module's UPPERCASE names, in source order, with their values and ``#:`` comments."""
    if module is None:
        from pytest_attnkit import contract as module
    source = inspect.getsource(module)
    source_lines = source.splitlines()
    lines = ["| name | value | what the code says about it |", "|---|---|---|"]
    for node in ast.parse(source).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if not isinstance(target, ast.Name) or not target.id.isupper():
            continue
        lines.append(f"| {code(target.id)} | {code(repr(getattr(module, target.id)))} | "
                     f"{markdown_cell(one_paragraph(_comment_above(source_lines, node.lineno)))} |")
    return "\n".join(lines)


def fields_markdown(qualified: str) -> str:
    """A dataclass's fields with their types and defaults, and its docstring."""
    import importlib

    module_name, _, class_name = qualified.rpartition(".")
    cls = getattr(importlib.import_module(module_name or "pytest_attnkit.contract"), class_name)
    lines = [rst_to_markdown(inspect.getdoc(cls) or ""), "", "| field | type | default |", "|---|---|---|"]
    for field in dataclasses.fields(cls):
        default = "required" if field.default is dataclasses.MISSING else code(repr(field.default))
        lines.append(f"| {code(field.name)} | {code(str(field.type))} | {default} |")
    return "\n".join(lines)


# -- the hooks ---------------------------------------------------------------------------------


def hooks_markdown(hookspecs: Any = None) -> str:
    """Every ``pytest_attnkit_*`` hook of the module, in source order."""
    if hookspecs is None:
        from pytest_attnkit import hookspecs

    parts = []
    for name, function in vars(hookspecs).items():
        if not name.startswith("pytest_attnkit_") or not callable(function):
            continue
        signature = _signature(function).replace('"', "")
        spec = getattr(function, "pytest_spec", None) or {}  # what @pytest.hookspec(...) set
        first = bool(spec.get("firstresult"))
        how = ("the first hook that returns something other than None decides" if first else
               "every implementation of the hook is called")
        parts += [f"### `{name}`", "", "```python", f"def {name}{signature}: ...", "```", "",
                  rst_to_markdown(inspect.getdoc(function) or ""), "", f"Called with keywords; {how}.", ""]
    return "\n".join(parts).strip()


# -- the README's sections ---------------------------------------------------------------------


def readme_section(title: str, readme: Path | None = None) -> str:
    """The body of the README's ``## title`` section, up to the next ``## `` heading."""
    text = (readme or REPO / "README.md").read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}[ \t]*\n(?P<body>.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    if match is None:
        raise LookupError(f"README.md has no section '## {title}'")
    body = match.group("body").strip()
    if any(found.group("link") for found in LINK_OR_CODE.finditer(body)):
        # A link relative to the README would point elsewhere from a page of docs/.
        raise ValueError(f"README.md's section '## {title}' is shown in the docs and must hold no links")
    return body


# -- the markers -------------------------------------------------------------------------------

GENERATORS: dict[str, Callable[[str | None], str]] = {
    "options": lambda argument: options_markdown(),
    "declarations": lambda argument: declarations_markdown(),
    "constants": lambda argument: constants_markdown(),
    "fields": lambda argument: fields_markdown(f"pytest_attnkit.contract.{argument}"),
    "hooks": lambda argument: hooks_markdown(),
    "readme": lambda argument: readme_section(argument or ""),
}


def render(markdown: str) -> str:
    """The page with every marker replaced by its generated part (an unknown marker raises)."""

    def replace(match: re.Match[str]) -> str:
        name, argument = match.group("name"), match.group("argument")
        if name not in GENERATORS:
            raise KeyError(f"unknown docs marker attnkit:{name} (known: {', '.join(GENERATORS)})")
        return GENERATORS[name](argument)

    return MARKER.sub(replace, markdown)


# -- links into the repository -----------------------------------------------------------------

#: A link, or a code span (scanned together, left to right, so that a link's label may hold code
#: and a code span may show a link's syntax without being one).
LINK_OR_CODE = re.compile(r"(?P<link>(?<!!)\[(?P<text>[^\]\n]+)\]\((?P<target>[^)\s]+)\))|(?P<code>(`+)[^`].*?\5)",
                          re.DOTALL)


def _repository_path(target: str, page: Path) -> Path | None:
    """The repository file a link target names, when it is one: a relative link that leaves
    docs/, or that points at the generator's own folder (which the site leaves out)."""
    target = target.split("#", 1)[0]
    if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
        return None
    resolved = (page.parent / target).resolve()
    if not resolved.is_relative_to(REPO):
        return None
    if resolved.is_relative_to(DOCS) and not resolved.is_relative_to(Path(__file__).resolve().parent):
        return None
    return resolved


def _each_link(markdown: str, change: Callable[[re.Match[str]], str]) -> str:
    """``markdown`` with each link outside code replaced by ``change(match)``."""

    def outside_fences(text: str) -> str:
        return LINK_OR_CODE.sub(lambda match: change(match) if match.group("link") else match.group(0), text)

    pieces, last = [], 0
    for match in FENCE.finditer(markdown):
        pieces += [outside_fences(markdown[last:match.start()]), match.group(0)]
        last = match.end()
    return "".join(pieces + [outside_fences(markdown[last:])])


def repository_links(markdown: str, page: Path) -> list[tuple[str, Path]]:
    """(link target, resolved path) of every link from ``page`` to a file of the repository."""
    found: list[tuple[str, Path]] = []

    def collect(match: re.Match[str]) -> str:
        resolved = _repository_path(match.group("target"), page)
        if resolved is not None:
            found.append((match.group("target"), resolved))
        return match.group(0)

    _each_link(markdown, collect)
    return found


def rewrite_repository_links(markdown: str, page: Path, repo_url: str | None) -> str:
    """Check each link into the repository, and render it for the site (see the module docstring)."""

    def one(match: re.Match[str]) -> str:
        target, label = match.group("target"), match.group("text")
        resolved = _repository_path(target, page)
        if resolved is None:
            return match.group(0)
        relative = resolved.relative_to(REPO).as_posix()
        if not resolved.exists():
            log.warning(f"{page.name}: the link {target} points at {relative}, which does not exist in the repository")
        if repo_url:
            kind = "tree" if resolved.is_dir() else "blob"
            return f"[{label}]({repo_url.rstrip('/')}/{kind}/main/{relative})"
        shown = label.strip("`").rstrip("/")
        return label if relative.rstrip("/").endswith(shown) else f"{label} (`{relative}`)"

    return _each_link(markdown, one)


# -- MkDocs' hook ------------------------------------------------------------------------------


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    source = Path(page.file.abs_src_path)
    markdown = render(markdown)
    return rewrite_repository_links(markdown, source, config.get("repo_url"))
