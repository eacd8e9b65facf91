"""The README and the documentation site say what the code does.

- Every code block marked as a complete program (a line `<!-- program -->` right above
  its fence) runs, against a fresh broker of its own, and exits cleanly. The program runs
  in a folder whose `ssb-data` is that broker's data directory, so
  `client.local_url("ssb-data")` finds it; the URL `ssb://admin:PASSWORD@127.0.0.1:4021`
  in a program is replaced with the broker's admin URL.
- The README's links lead to files that exist, and to headings that exist in them (the
  site's own links are checked by `mkdocs build --strict` in the test command).
- The generated references cover every setting and every error code, and a setting the
  docs do not describe fails the build.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from daemon import BrokerProcess
from markdown.extensions.toc import slugify

from ssb.broker import _config
from ssb.protocol import ErrorCode

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARK = "<!-- program -->"
DOCUMENTED_URL = "ssb://admin:PASSWORD@127.0.0.1:4021"
PROGRAM_TIMEOUT = 120.0
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Program:
    page: Path
    line: int
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def marked_programs() -> list[Program]:
    """Every block marked as a complete program, in README.md and docs/."""
    programs = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for found in re.finditer(re.escape(MARK) + r"\n", text):
            line = text.count("\n", 0, found.start()) + 1
            fence = FENCE.match(text, found.end())
            if fence is None or fence.group(1) != "python":
                raise AssertionError(
                    f"{page.relative_to(ROOT)}:{line}: {MARK} must stand right above a"
                    " ```python fence"
                )
            programs.append(Program(page, line, fence.group(2)))
    return programs


PROGRAMS = marked_programs()


def test_the_readme_and_the_docs_have_programs_to_run() -> None:
    pages = {p.page.name for p in PROGRAMS}
    assert "README.md" in pages
    assert len(PROGRAMS) >= 5, [p.name for p in PROGRAMS]


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_a_complete_program_runs(program: Program, tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "ssb-data").start()
    try:
        source = tmp_path / "program.py"
        source.write_text(program.code.replace(DOCUMENTED_URL, broker.url), encoding="utf-8")
        done = subprocess.run(
            [sys.executable, source.name],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=PROGRAM_TIMEOUT,
        )
        assert done.returncode == 0, (
            f"the program at {program.name} failed (exit {done.returncode}):\n"
            f"{done.stderr[-4000:]}\nits output:\n{done.stdout[-2000:]}"
        )
    finally:
        broker.kill()


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slugify(title.strip(), "-") for title in HEADING.findall(text)}


def test_the_readmes_links_lead_somewhere() -> None:
    readme = ROOT / "README.md"
    broken = []
    for target in LINK.findall(FENCE.sub("", readme.read_text(encoding="utf-8"))):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        file = (ROOT / path) if path else readme
        if not file.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and anchor not in _anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {path or 'README.md'}")
    assert not broken, broken


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "docs_reference", ROOT / "docs/hooks/reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_references_cover_every_setting_and_every_code() -> None:
    hook = _hook()
    configuration = hook.render("configuration")
    for cls in (_config.Config, _config.ClientLimits):
        for name in cls.__dataclass_fields__:
            if name not in ("limits", "sections"):
                assert f"| `{name}`" in configuration, name
    for section in _config.SECTION_DOCS.values():
        for name in section:
            assert f"| `{name}`" in configuration, name
    errors = hook.render("errors")
    for code in ErrorCode:
        assert f"| {code.value} | `{code.name}` |" in errors, code
    assert "### ssb serve" in hook.render("commands")


def test_a_setting_without_a_description_fails_the_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hook = _hook()
    described = dict(_config.SECTION_DOCS["transport"])
    del described["forward_size"]
    monkeypatch.setattr(_config, "SECTION_DOCS", {**_config.SECTION_DOCS, "transport": described})
    with pytest.raises(hook.ReferenceDriftError, match="forward_size"):
        hook.render("configuration")


def test_an_unknown_reference_fails_the_build() -> None:
    hook = _hook()
    with pytest.raises(hook.ReferenceDriftError, match="unknown reference 'nonsense'"):
        hook.on_page_markdown("# A page\n\n<!-- reference: nonsense -->\n")
