"""Script files as sqlcmd reads them, cut into batches at GO.

A file is UTF-8 (with or without a byte-order mark) or UTF-16 with a byte-order mark,
with any line endings (CRLF, LF, CR). A batch ends at a line holding only `GO`
(any case, spaces around it, an optional repeat count, an optional `--` comment):
`GO 3` runs the batch three times. GO is sqlcmd's word, not T-SQL's, so it is found
line by line before any lexing, as sqlcmd finds it, except inside a block comment or a
string that runs over several lines. Each batch remembers the file line it starts on,
so every error names the line of the file.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Final

_GO: Final = re.compile(r"^[ \t]*go(?:[ \t]+(\d+))?[ \t]*(?:--.*)?$", re.IGNORECASE)
MAX_GO_COUNT: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch of a script: its text, the file line it starts on, how often GO runs it."""

    text: str
    first_line: int
    count: int = 1
    source: str = ""


class SourceError(Exception):
    """A file that cannot be read as a script (an encoding that is none of sqlcmd's)."""


def decode(data: bytes, name: str = "<input>") -> str:
    """A script's bytes as text: UTF-16 by its byte-order mark, else UTF-8."""
    try:
        if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            return data.decode("utf-16")
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SourceError(
            f"{name} is neither UTF-8 nor UTF-16 with a byte-order mark ({exc.reason} at byte"
            f" {exc.start}); save it as UTF-8"
        ) from None


def split_batches(text: str, source: str = "") -> list[Batch]:
    """The batches of a script, cut at GO lines (line endings made \\n)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    batches: list[Batch] = []
    current: list[str] = []
    start = 1
    state = _Scan()
    for number, line in enumerate(lines, 1):
        match = _GO.match(line) if state.free() else None
        if match is None:
            current.append(line)
            state.feed(line + "\n")
            continue
        count = int(match.group(1)) if match.group(1) else 1
        if not 1 <= count <= MAX_GO_COUNT:
            raise SourceError(f"line {number}: GO {count}: the count must be 1..{MAX_GO_COUNT}")
        batches.append(Batch("\n".join(current), start, count, source))
        current = []
        start = number + 1
    tail = "\n".join(current)
    if tail.strip():
        batches.append(Batch(tail, start, 1, source))
    return [b for b in batches if b.text.strip()]


class _Scan:
    """Whether a line starts outside strings, quoted names and block comments (where a
    GO line is a batch separator)."""

    __slots__ = ("comment", "quote")

    def __init__(self) -> None:
        self.comment = 0
        self.quote = ""

    def free(self) -> bool:
        return self.comment == 0 and not self.quote

    def feed(self, line: str) -> None:
        i, n = 0, len(line)
        while i < n:
            c = line[i]
            if self.quote:
                if c == self.quote:
                    if i + 1 < n and line[i + 1] == self.quote:
                        i += 1
                    else:
                        self.quote = ""
            elif self.comment:
                if line.startswith("*/", i):
                    self.comment -= 1
                    i += 1
                elif line.startswith("/*", i):
                    self.comment += 1
                    i += 1
            elif line.startswith("--", i):
                return
            elif line.startswith("/*", i):
                self.comment += 1
                i += 1
            elif c in "'\"":
                self.quote = c
            elif c == "[":
                self.quote = "]"
            i += 1
