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
                out.append(_character_set(pattern[i + 1 : close]))
                i = close
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.IGNORECASE | re.DOTALL)


def _character_set(body: str) -> str:
    """A LIKE set's body (between [ and ]) as a regular expression: its characters and
    ranges taken literally (a range whose ends are backwards holds nothing, as in SQL
    Server), every character that means something in a Python set escaped."""
    negate = body.startswith("^")
    if negate:
        body = body[1:]
    parts: list[str] = []
    j = 0
    while j < len(body):
        if j + 2 < len(body) and body[j + 1] == "-":  # a range: first-last
            low, high = body[j], body[j + 2]
            if low <= high:
                parts.append(f"{re.escape(low)}-{re.escape(high)}")
            j += 3
        else:
            parts.append(re.escape(body[j]))
            j += 1
    if not parts:  # an empty set matches no character (its negation any)
        return "." if negate else "(?!)"
    return f"[{'^' if negate else ''}{''.join(parts)}]"
