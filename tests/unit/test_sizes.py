"""The house's size rules, measured: no module of broker/, protocol/ or client/ over 800
lines, and no class of the shipped packages over 600 (its `class` line to its last)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE_PACKAGES = ("broker", "protocol", "client")
CLASS_PACKAGES = ("broker", "protocol", "client", "spark_bridge", "tools")
MAX_MODULE_LINES = 800
MAX_CLASS_LINES = 600


def _modules(packages: tuple[str, ...]) -> Iterator[Path]:
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


def test_the_rules_see_the_packages() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in _modules(CLASS_PACKAGES)}
    assert {"broker/_core/delivery.py", "protocol/_dialog.py", "client/_calls.py"} <= names


def test_no_module_is_longer_than_the_limit() -> None:
    long = {
        path.relative_to(ROOT).as_posix(): lines
        for path in _modules(MODULE_PACKAGES)
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concept): {long}"


def test_no_class_is_longer_than_the_limit() -> None:
    long = {}
    for path in _modules(CLASS_PACKAGES):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    long[f"{path.relative_to(ROOT).as_posix()}:{node.name}"] = lines
    assert not long, f"classes over {MAX_CLASS_LINES} lines (split them by owned state): {long}"
