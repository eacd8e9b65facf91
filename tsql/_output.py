"""What a batch gives back, in order: result sets, messages (PRINT, informational
RAISERROR, rows affected) and errors; and the three ways `ssb sql` writes them.

`TextOutput` writes aligned tables as sqlcmd does (with "(N rows affected)" unless
SET NOCOUNT ON); `CsvOutput` and `JsonOutput` write result sets for scripts (CSV with
a header per result set, a blank line between sets; JSON one object per line:
{"columns": [...], "rows": [[...]]}, messages and errors as {"message": ...} and
{"error": {...}}). Errors always go to stderr, as sqlcmd sends them.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from typing import IO, Protocol

from ._errors import SqlError
from ._types import SqlType, Value, display, plain


@dataclass(slots=True)
class ResultSet:
    columns: list[str]
    types: list[SqlType]
    rows: list[list[Value]] = field(default_factory=list)


class Output(Protocol):
    def result(self, result: ResultSet, nocount: bool) -> None: ...

    def message(self, text: str) -> None: ...

    def error(self, error: SqlError) -> None: ...


class Collect:
    """Keeps everything, in order (tests and the shell read it)."""

    def __init__(self) -> None:
        self.items: list[ResultSet | str | SqlError] = []

    def result(self, result: ResultSet, nocount: bool) -> None:
        self.items.append(result)

    def message(self, text: str) -> None:
        self.items.append(text)

    def error(self, error: SqlError) -> None:
        self.items.append(error)

    @property
    def results(self) -> list[ResultSet]:
        return [i for i in self.items if isinstance(i, ResultSet)]

    @property
    def messages(self) -> list[str]:
        return [i for i in self.items if isinstance(i, str)]

    @property
    def errors(self) -> list[SqlError]:
        return [i for i in self.items if isinstance(i, SqlError)]


class TextOutput:
    def __init__(self, out: IO[str], err: IO[str]) -> None:
        self.out = out
        self.err = err

    def result(self, result: ResultSet, nocount: bool) -> None:
        self.out.write(format_table(result) + "\n")
        if not nocount:
            count = len(result.rows)
            self.out.write(f"\n({count} row{'s' if count != 1 else ''} affected)\n")
        self.out.write("\n")
        self.out.flush()

    def message(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def error(self, error: SqlError) -> None:
        self.out.flush()
        self.err.write(error.format() + "\n")
        self.err.flush()


class CsvOutput(TextOutput):
    def result(self, result: ResultSet, nocount: bool) -> None:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(result.columns)
        for row in result.rows:
            writer.writerow(["" if v.data is None else display(v) for v in row])
        self.out.write(buffer.getvalue() + "\n")
        self.out.flush()

    def message(self, text: str) -> None:
        self.err.write(text + "\n")


class JsonOutput(TextOutput):
    def result(self, result: ResultSet, nocount: bool) -> None:
        rows = [[plain(v) for v in row] for row in result.rows]
        self.out.write(json.dumps({"columns": result.columns, "rows": rows}) + "\n")
        self.out.flush()

    def message(self, text: str) -> None:
        self.out.write(json.dumps({"message": text}) + "\n")

    def error(self, error: SqlError) -> None:
        super().error(error)
        self.out.write(
            json.dumps(
                {
                    "error": {
                        "number": error.number,
                        "level": error.level,
                        "state": error.state,
                        "line": error.line,
                        "message": error.text,
                    }
                }
            )
            + "\n"
        )


def format_table(result: ResultSet) -> str:
    """An aligned table, the way sqlcmd draws one (header, dashes, rows)."""
    columns = result.columns
    cells = [[display(v) for v in row] for row in result.rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = [" ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append(" ".join("-" * w for w in widths))
    lines += [" ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)
