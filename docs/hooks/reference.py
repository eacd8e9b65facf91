"""The documentation's generated references, written from the code's own definitions.

A page asks for one with a line of its own, `<!-- reference: NAME -->`, which this
mkdocs hook replaces while the site is built:

- `configuration`: every setting of the config file, section by section, from the
  dataclasses that hold them (`Config`, `ClientLimits`, `ActivationSettings`,
  `TransportSettings`): the name, the default, the values it takes and the
  description. The values a setting takes are read from the daemon's own check: the
  error a config file with a wrong value gets says what is allowed ("must be a whole
  number from 1 to 1000000"). Descriptions are the settings' docstrings in
  `broker/_config.py`, or `SECTION_DOCS` there for the sections other modules define.
- `commands`: the help of every `ssb` command, from its argument parser.
- `errors`: every `ErrorCode` with the client exception it raises (`error_for`), and
  every client exception with what it means (its docstring) and its codes.

A setting without a description, a description of no setting, a section nobody
documents or an unknown reference name fails the build with a message that says what
to add where, so the references cannot fall behind the code.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import tempfile
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ssb import client
from ssb.broker import _config, cli
from ssb.broker._activation.manager import ActivationSettings
from ssb.broker._transport import TransportSettings
from ssb.client._errors import error_for
from ssb.protocol import ErrorCode

MARKER = re.compile(r"^<!-- reference: ([a-z]+) -->$", re.MULTILINE)
PROBE = "?"  # a value no setting takes: the check's complaint says what it does take
HELP_WIDTH = 88


class ReferenceDriftError(Exception):
    """The code and its documentation disagree; the message says how to mend it."""


# ---- the mkdocs hook -----------------------------------------------------------------


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace each reference marker of a page with the reference it names."""
    return MARKER.sub(lambda match: render(match.group(1)), markdown)


def render(name: str) -> str:
    """The Markdown of the reference called `name`."""
    makers: dict[str, Callable[[], str]] = {
        "configuration": configuration_reference,
        "commands": command_reference,
        "errors": error_reference,
    }
    if name not in makers:
        raise ReferenceDriftError(f"unknown reference {name!r}; known: {', '.join(sorted(makers))}")
    return makers[name]()


# ---- configuration -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    default: str
    allowed: str
    description: str
    option: str | None = None  # the `ssb serve` option that overrides it


def configuration_reference() -> str:
    sections = {"Top level": _top_level(), "[limits]": _limits()}
    sections |= {f"[{name}]": settings for name, settings in _other_sections().items()}
    parts = [f"### {heading}\n\n{_settings_table(rows)}" for heading, rows in sections.items()]
    return "\n\n".join(parts) + "\n"


def _top_level() -> list[Setting]:
    docs = attribute_docs(_config.Config)
    options = _serve_options()
    settings = []
    for f in dataclasses.fields(_config.Config):
        if f.name in ("limits", "sections"):  # the [limits] and other sections
            continue
        if f.name not in docs:
            raise ReferenceDriftError(
                f"Config.{f.name} has no description: give it a docstring in broker/_config.py"
            )
        settings.append(
            Setting(
                f.name,
                _shown_default(f),
                _allowed_top_level(f.name) or _kind(f.type),
                docs[f.name],
                options.get(f.name),
            )
        )
    return settings


def _limits() -> list[Setting]:
    docs = attribute_docs(_config.ClientLimits)
    missing = [f.name for f in dataclasses.fields(_config.ClientLimits) if f.name not in docs]
    if missing:
        raise ReferenceDriftError(
            f"ClientLimits.{', '.join(missing)} has no description: give it a docstring in"
            " broker/_config.py"
        )
    return _section_settings("limits", _config.ClientLimits, docs)


def _other_sections() -> dict[str, list[Setting]]:
    classes: dict[str, Any] = {"activation": ActivationSettings, "transport": TransportSettings}
    if set(_config.SECTIONS) != set(classes):
        raise ReferenceDriftError(
            f"the config has the sections {', '.join(_config.SECTIONS)}; the configuration"
            f" reference documents {', '.join(classes)}: teach docs/hooks/reference.py the"
            " difference"
        )
    result = {}
    for section, cls in classes.items():
        docs = dict(_config.SECTION_DOCS.get(section, {}))
        names = {f.name for f in dataclasses.fields(cls)}
        if names != set(docs):
            undescribed = ", ".join(sorted(names - set(docs))) or "none"
            unknown = ", ".join(sorted(set(docs) - names)) or "none"
            raise ReferenceDriftError(
                f"[{section}]: settings without a description in SECTION_DOCS of"
                f" broker/_config.py: {undescribed}; descriptions of no setting: {unknown}"
            )
        result[section] = _section_settings(section, cls, docs)
    return result


def _section_settings(section: str, cls: Any, docs: Mapping[str, str]) -> list[Setting]:
    settings = []
    for f in dataclasses.fields(cls):
        try:
            cls.from_section({f.name: PROBE})
            allowed = _kind(f.type)
        except _config.ConfigError as exc:
            complaint = str(exc).removeprefix(f"[{section}] ")
            allowed = _what_is_allowed(complaint, f.name)
        settings.append(Setting(f.name, _shown_default(f), allowed, docs[f.name]))
    return settings


def _allowed_top_level(name: str) -> str | None:
    """What a top-level setting takes, from the complaint about a wrong value in a config
    file (with the HTTP port on, which some settings need); None if it takes any text."""
    lines = [f"{name} = {PROBE!r}".replace("'", '"')]
    if name != "http_port":
        lines.append("http_port = 0")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "probe.toml"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        try:
            _config.load(path, {})
        except _config.ConfigError as exc:
            return _what_is_allowed(str(exc), name)
    return None


def _what_is_allowed(complaint: str, name: str) -> str:
    """'x must be a port number 0..65535, not '?'' -> 'a port number 0..65535'."""
    found = re.match(rf"{re.escape(name)} must be (.+?)(?:, not .*)?$", complaint, re.DOTALL)
    if found is None:
        raise ReferenceDriftError(
            f"cannot tell what {name} takes from the error a wrong value gets: {complaint!r};"
            " the error should read '{name} must be ...'"
        )
    return found.group(1)


def _kind(annotation: object) -> str:
    """What an unchecked setting takes, from its annotation."""
    return "a path" if "Path" in str(annotation) else "text"


def _shown_default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        raise ReferenceDriftError(f"setting {f.name} has no default")
    return toml_value(value, f.name)


def toml_value(value: object, name: str = "") -> str:
    """A default as it is written in the config file (None: not set)."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int):
        if name.endswith(("_size", "_bytes", "_disk")) and value >= 1024 and value % 1024 == 0:
            return f"`{value}` ({_bytes(value)})"
        text = str(value)
    elif isinstance(value, float):
        text = repr(value)
    elif isinstance(value, tuple | list):
        text = "[" + ", ".join(f'"{v}"' for v in value) + "]"
    else:
        text = f'"{value}"'
    return f"`{text}`"


def _bytes(value: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value % size == 0:
            return f"{value // size} {unit}"
    return f"{value} bytes"


def _serve_options() -> dict[str, str]:
    """Setting name -> the `ssb serve` option that overrides it."""
    serve = _subcommands()["serve"]
    return {
        action.dest: action.option_strings[-1]
        for action in serve._actions
        if action.option_strings and action.dest not in ("help", "config")
    }


def _settings_table(settings: list[Setting]) -> str:
    rows = ["| setting | default | takes | what it is |", "|---|---|---|---|"]
    for s in settings:
        name = f"`{s.name}`" + (f"<br>`{s.option}`" if s.option else "")
        cells = (name, s.default, _cell(s.allowed), _cell(s.description))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings written under a class's annotated attributes, by attribute."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    (node,) = tree.body
    assert isinstance(node, ast.ClassDef)
    docs = {}
    for statement, following in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


# ---- commands ------------------------------------------------------------------------


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli._parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise ReferenceDriftError("the ssb command has no subcommands any more")


def command_reference() -> str:
    parts = []
    for name, parser in _subcommands().items():
        parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=HELP_WIDTH)
        parts.append(f"### ssb {name}\n\n```text\n{parser.format_help().rstrip()}\n```")
    return "\n\n".join(parts) + "\n"


# ---- errors --------------------------------------------------------------------------


def error_reference() -> str:
    classes = _error_classes()
    raised_as = {code: type(error_for(code, "")) for code in ErrorCode}
    unexported = {cls.__name__ for cls in raised_as.values()} - {c.__name__ for c in classes}
    if unexported:
        raise ReferenceDriftError(f"codes raise {', '.join(sorted(unexported))}, not in ssb.client")
    codes = ["| code | name | raised as |", "|---|---|---|"]
    codes += [f"| {c.value} | `{c.name}` | `{raised_as[c].__name__}` |" for c in ErrorCode]
    table = ["| exception | is a | codes | what it means |", "|---|---|---|---|"]
    for cls in classes:
        base = cls.__bases__[0].__name__ if cls is not client.BrokerError else "Exception"
        mine = [str(c.value) for c in ErrorCode if raised_as[c] is cls]
        doc = _cell(inspect.getdoc(cls) or "")
        table.append(f"| `{cls.__name__}` | `{base}` | {', '.join(mine) or 'none'} | {doc} |")
    return "### Exceptions\n\n" + "\n".join(table) + "\n\n### Codes\n\n" + "\n".join(codes) + "\n"


def _error_classes() -> list[type[client.BrokerError]]:
    """The client's exceptions, each after its base, in the order they are defined."""
    exported = [getattr(client, name) for name in client.__all__]
    found = [c for c in exported if isinstance(c, type) and issubclass(c, client.BrokerError)]
    found.sort(key=lambda c: inspect.getsourcelines(c)[1])
    ordered: list[type[client.BrokerError]] = []

    def visit(parent: type) -> None:
        for cls in found:
            if cls.__bases__[0] is parent:
                ordered.append(cls)
                visit(cls)

    ordered.append(client.BrokerError)
    visit(client.BrokerError)
    return ordered
