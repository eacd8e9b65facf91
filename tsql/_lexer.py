"""T-SQL's tokens, as SQL Server lexes them.

Theory of operation. One compiled pattern finds the next token; block comments nest
(`/* a /* b */ c */` is one comment) and are scanned by hand. Names are plain
(`status`, `#temp`, `sys`), bracketed (`[//AWDB/1DBSample/RequestMessage]`, `]]` is a
`]`) or double-quoted (`""` is a `"`); keywords are plain names compared without case,
so a keyword can still be a column name where the grammar allows one. Strings are
'...' or N'...' with '' for a quote, over any number of lines; `0x1F` is a binary
literal; `@x` a variable and `@@ROWCOUNT` a system function. Every token knows its line
in the file (the batch's first line is given) and its column, for error messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from typing import Final

from ._errors import SYNTAX_LEVEL, SqlError


class Kind(Enum):
    NAME = "name"  # a plain name or keyword
    QUOTED = "quoted"  # a [bracketed] or "quoted" name
    VARIABLE = "variable"  # @name
    SYSTEM = "system"  # @@name
    STRING = "string"  # 'text'
    NSTRING = "nstring"  # N'text'
    INTEGER = "integer"
    DECIMAL = "decimal"
    FLOAT = "float"
    BINARY = "binary"  # 0x...
    OP = "op"  # punctuation and operators
    END = "end"  # the end of the batch


@dataclass(frozen=True, slots=True)
class Token:
    kind: Kind
    text: str  # as written
    value: object  # the name (unquoted), the string, the number, the bytes
    upper: str  # for names: the name in upper case (keywords compare on it)
    line: int
    column: int
    start: int  # offsets into the batch's text
    end: int


_PATTERN: Final = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<line_comment>--[^\n]*)
  | (?P<block_comment>/\*)
  | (?P<nstring>[Nn]')
  | (?P<string>')
  | (?P<binary>0[xX][0-9A-Fa-f]*)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<system>@@[A-Za-z_0-9$#@]+)
  | (?P<variable>@[A-Za-z_0-9$#@]+)
  | (?P<bracket>\[)
  | (?P<dquote>")
  | (?P<name>[A-Za-z_#\u0080-\uffff][A-Za-z_0-9$#@\u0080-\uffff]*)
  | (?P<op><=|>=|<>|!=|!<|!>|\+=|-=|\*=|/=|%=|&=|\|=|\^=|::|[-+*/%=<>(),.;&|^~!:{}])
    """,
    re.VERBOSE,
)


def tokenize(text: str, first_line: int = 1) -> list[Token]:
    """The tokens of one batch, ending with an END token.

    Raises:
        SqlError: Msg 105 for a string or quoted name left open, 113 for a comment.
    """
    tokens: list[Token] = []
    append = tokens.append
    pos, n = 0, len(text)
    line, line_start = first_line, 0
    match = _PATTERN.match
    while pos < n:
        m = match(text, pos)
        if m is None:
            raise _unexpected(text[pos], line, pos - line_start + 1)
        group = m.lastgroup
        end = m.end()
        column = pos - line_start + 1
        if group == "space" or group == "line_comment":
            pass
        elif group == "block_comment":
            end = _comment_end(text, end, line)
        elif group == "string" or group == "nstring":
            end, value = _quoted(text, end, "'", line, column)
            kind = Kind.STRING if group == "string" else Kind.NSTRING
            append(Token(kind, text[pos:end], value, "", line, column, pos, end))
        elif group == "bracket":
            end, value = _quoted(text, end, "]", line, column)
            append(Token(Kind.QUOTED, text[pos:end], value, value.upper(), line, column, pos, end))
        elif group == "dquote":
            end, value = _quoted(text, end, '"', line, column)
            append(Token(Kind.QUOTED, text[pos:end], value, value.upper(), line, column, pos, end))
        elif group == "name":
            word = m.group()
            append(Token(Kind.NAME, word, word, word.upper(), line, column, pos, end))
        elif group == "number":
            append(_number(m.group(), line, column, pos, end))
        elif group == "binary":
            append(_binary(m.group(), line, column, pos, end))
        elif group == "variable":
            word = m.group()
            append(Token(Kind.VARIABLE, word, word, word.upper(), line, column, pos, end))
        elif group == "system":
            word = m.group()
            append(Token(Kind.SYSTEM, word, word, word.upper(), line, column, pos, end))
        else:
            op = m.group()
            append(Token(Kind.OP, op, op, op, line, column, pos, end))
        newlines = text.count("\n", pos, end)
        if newlines:
            line += newlines
            line_start = text.rindex("\n", pos, end) + 1
        pos = end
    append(Token(Kind.END, "", None, "", line, pos - line_start + 1, n, n))
    return tokens


def _comment_end(text: str, pos: int, line: int) -> int:
    depth = 1
    while depth:
        close = text.find("*/", pos)
        if close < 0:
            raise SqlError(113, "Missing end comment mark '*/'.", level=SYNTAX_LEVEL, line=line)
        opening = text.find("/*", pos, close)
        if opening >= 0:
            depth += 1
            pos = opening + 2
        else:
            depth -= 1
            pos = close + 2
    return pos


def _quoted(text: str, pos: int, close: str, line: int, column: int) -> tuple[int, str]:
    """From just after the opening quote: the end offset and the unescaped value."""
    parts = []
    while True:
        found = text.find(close, pos)
        if found < 0:
            start = text[pos : pos + 30]
            raise SqlError(
                105,
                f"Unclosed quotation mark after the character string '{start}'.",
                level=SYNTAX_LEVEL,
                line=line,
                column=column,
            )
        parts.append(text[pos:found])
        if text.startswith(close * 2, found):
            parts.append(close)
            pos = found + 2
            continue
        return found + 1, "".join(parts)


def _number(word: str, line: int, column: int, pos: int, end: int) -> Token:
    if "e" in word or "E" in word:
        return Token(Kind.FLOAT, word, float(word), "", line, column, pos, end)
    if "." in word:
        return Token(Kind.DECIMAL, word, Decimal(word), "", line, column, pos, end)
    return Token(Kind.INTEGER, word, int(word), "", line, column, pos, end)


def _binary(word: str, line: int, column: int, pos: int, end: int) -> Token:
    digits = word[2:]
    if len(digits) % 2:
        digits = "0" + digits
    return Token(Kind.BINARY, word, bytes.fromhex(digits), "", line, column, pos, end)


def _unexpected(char: str, line: int, column: int) -> SqlError:
    return SqlError(
        102,
        f"Incorrect syntax near '{char}'. (column {column})",
        level=SYNTAX_LEVEL,
        line=line,
        column=column,
    )
