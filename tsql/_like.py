"""LIKE (and PATINDEX) as SQL Server matches it: % and _, [abc] and [^abc] sets, an ESCAPE character,
without case (the default collation)."""

from __future__ import annotations

import re
from functools import lru_cache


def like(value: str, pattern: str, escape: str | None = None) -> bool:
    return _compile(pattern, escape).fullmatch(value.rstrip(" ")) is not None or (
        _compile(pattern, escape).fullmatch(value) is not None
    )


def patindex(pattern: str, value: str) -> int:
    """PATINDEX: where `pattern` (a LIKE pattern, usually `%...%`) first matches `value`,
    from 1; 0 when it does not."""
    leading = pattern.startswith("%")
    compiled = _compile(pattern[1:] if leading else pattern, None)
    for start in range(len(value) + 1) if leading else (0,):
        if compiled.fullmatch(value, start) is not None:
            return start + 1
    return 0


@lru_cache(maxsize=256)
def _compile(pattern: str, escape: str | None) -> re.Pattern[str]:
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if escape and c == escape and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if c == "%":
            out.append(".*")
        elif c == "_":
            out.append(".")
        elif c == "[":
            close = pattern.find("]", i + 1)
            if close < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : close]
                negate = body.startswith("^")
                if negate:
                    body = body[1:]
                escaped = "".join("\\" + ch if ch in "\\]^" else ch for ch in body)
                out.append(f"[{'^' if negate else ''}{escaped}]")
                i = close
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.IGNORECASE | re.DOTALL)
