"""The packages' import graphs have no cycles, none imports another's private modules,
and protocol/ stays pure.

Every import statement counts, wherever it stands (module level, inside a function,
under TYPE_CHECKING): a cycle at any of those places is a tangle a reader has to
hold in their head, and it is how wiring by import-time side effects creeps back.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "protocol", "client", "spark_bridge", "tools", "tsql")


def _modules(package: str) -> dict[str, Path]:
    found = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found["ssb." + ".".join(parts)] = path
    return found


def _statements(module: str, path: Path) -> Iterator[tuple[str, list[str]]]:
    """(module, names) of each import in `module`, relative imports resolved:
    `import a.b` is ("a.b", []), `from x import y, z` is ("x", ["y", "z"])."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            yield target, [alias.name for alias in node.names]


def _imports(module: str, path: Path, known: set[str]) -> Iterator[str]:
    """Modules of `known` that `module` imports (`from x import y`: x.y if that is a
    module, else x)."""
    for target, names in _statements(module, path):
        if not names and target in known:
            yield target
        for name in names:
            if f"{target}.{name}" in known:
                yield f"{target}.{name}"
            elif target in known:
                yield target


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package: str) -> None:
    modules = _modules(package)
    known = set(modules)
    graph = {name: set(_imports(name, path, known)) - {name} for name, path in modules.items()}
    # a package's __init__ re-exports its modules; importing it is importing them all
    assert _cycles(graph) == []


def _private_elsewhere(imported: str, package: str) -> bool:
    """Whether `imported` is a private module (or a name in one) of another package."""
    parts = imported.split(".")
    return (
        len(parts) > 2
        and parts[0] == "ssb"
        and parts[1] in PACKAGES
        and parts[1] != package
        and any(part.startswith("_") for part in parts[2:])
    )


def test_no_package_imports_another_packages_private_modules() -> None:
    """Between packages only the public surface (each `__init__.__all__`) is used: a
    name like `ssb.client._url` may be imported only from inside `ssb.client`."""
    found = []
    for package in PACKAGES:
        for name, path in _modules(package).items():
            for target, names in _statements(name, path):
                if _private_elsewhere(target, package) or any(
                    _private_elsewhere(f"{target}.{n}", package) for n in names
                ):
                    found.append(f"{name} imports from {target}")
    assert found == []


def test_protocol_is_pure() -> None:
    forbidden = {"asyncio", "socket", "threading", "time", "selectors", "ssl"}
    for name, path in _modules("protocol").items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for imported in names:
                assert imported.split(".")[0] not in forbidden, f"{name} imports {imported}"
