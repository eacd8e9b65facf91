"""Functions named `package.module:function`: naming one, and importing one by its name.

Activation procedures, the scheduler's tasks and the Spark bridge's reader functions
are all named this way, because the process that runs one (an activation worker, a
scheduler reader, a Spark executor) is not the process that named it. The part after
the colon may be a dotted path (`package.module:Class.method`). A function is
imported once per process and kept.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

FORM = "'package.module:function'"

_loaded: dict[str, Callable[..., Any]] = {}


def split_function_name(name: str) -> tuple[str, str]:
    """(module, attribute path) of `package.module:function`.

    Raises:
        ValueError: `name` does not have that form.
    """
    module, colon, attribute = name.partition(":")
    if not colon or not module or not attribute or ":" in attribute:
        raise ValueError(f"a function is named {FORM}, got {name!r}")
    return module, attribute


def function_name(function: str | Callable[..., Any]) -> str:
    """`package.module:function` for a function given by name (checked) or as an object.

    Raises:
        ValueError: the name has not that form, or the function cannot be imported by
            name in another process (a lambda, a nested function, one in `__main__`).
    """
    if isinstance(function, str):
        split_function_name(function)
        return function
    module: str | None = getattr(function, "__module__", None)
    qualname: str | None = getattr(function, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise ValueError(f"{function!r} cannot be named for another process; pass {FORM}")
    if module == "__main__":
        raise ValueError(
            f"{qualname} lives in __main__, which other processes cannot import; "
            f"move it into a module or pass {FORM}"
        )
    return f"{module}:{qualname}"


def load_function(name: str, where: str = "") -> Callable[..., Any]:
    """Import the function named `package.module:function` (once per process).

    Args:
        name: the function's name.
        where: where this process imports from, said when the module is missing
            (e.g. "activation workers import from [activation] python_path").
    Raises:
        ImportError: the name is malformed, its module cannot be imported, the module
            has no such attribute, or the attribute is not callable; the message says
            which.
    """
    found = _loaded.get(name)
    if found is not None:
        return found
    try:
        module_name, attribute = split_function_name(name)
    except ValueError as exc:
        raise ImportError(f"cannot load {name!r}: {exc}") from None
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"; {where}" if where else ""
        raise ImportError(f"cannot load {name!r}: {exc}{hint}", name=module_name) from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ImportError(
                f"cannot load {name!r}: {module_name} has no attribute {attribute!r}",
                name=module_name,
            ) from None
    if not callable(target):
        raise ImportError(f"cannot load {name!r}: it is not callable", name=module_name)
    _loaded[name] = target
    return target  # type: ignore[no-any-return]
