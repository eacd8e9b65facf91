"""`ssb.tools` works a broker from outside: of the other packages it imports only the
public names (their `__all__`), so that what it does any program could do."""

from __future__ import annotations

import ast
from pathlib import Path

from ssb import client, protocol

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {"ssb.client": set(client.__all__), "ssb.protocol": set(protocol.__all__)}


def _outside_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of each import from another ssb package ('' for a whole module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == "ssb":
                found += [(f"ssb.{alias.name}", "") for alias in node.names]
            else:
                found += [(node.module, alias.name) for alias in node.names]
    return [
        (module, name)
        for module, name in found
        if module.startswith("ssb.") and not module.startswith("ssb.tools")
    ]


def test_tools_import_only_the_public_names_of_the_client_and_the_protocol() -> None:
    files = sorted((ROOT / "tools").rglob("*.py"))
    assert files
    for path in files:
        for module, name in _outside_imports(path):
            where = path.relative_to(ROOT)
            assert module in PUBLIC, f"{where} imports {module}: only ssb.client, ssb.protocol"
            assert not name or name in PUBLIC[module], f"{where} imports {module}.{name}"
