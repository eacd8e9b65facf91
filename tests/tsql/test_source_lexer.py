"""Files and tokens as sqlcmd and SQL Server read them."""

from __future__ import annotations

import codecs
from decimal import Decimal

import pytest

from ssb.tsql import SourceError, decode, split_batches
from ssb.tsql._lexer import Kind, tokenize


def test_go_alone_on_a_line_with_a_count_and_a_comment() -> None:
    text = "SELECT 1\n  go  \nSELECT 2\nGO 3 -- three times\nSELECT 'GO'\nGOTO x\n"
    batches = split_batches(text)
    assert [(b.text.strip(), b.first_line, b.count) for b in batches] == [
        ("SELECT 1", 1, 1),
        ("SELECT 2", 3, 3),
        ("SELECT 'GO'\nGOTO x", 5, 1),
    ]


def test_go_inside_a_block_comment_or_a_string_does_not_split() -> None:
    text = "/* a\nGO\n*/ SELECT 1\nGO\nPRINT N'line\nGO\nend'\nGO\n"
    batches = split_batches(text)
    assert len(batches) == 2
    assert batches[1].first_line == 5


def test_any_line_endings_and_the_line_numbers_of_the_file() -> None:
    text = "SELECT 1\r\nGO\r\n\r\nSELECT\r2\rGO\n"
    batches = split_batches(text)
    assert [(b.text, b.first_line) for b in batches] == [("SELECT 1", 1), ("\nSELECT\n2", 3)]


@pytest.mark.parametrize(
    "data",
    [
        "PRINT N'é'".encode(),
        codecs.BOM_UTF8 + "PRINT N'é'".encode(),
        codecs.BOM_UTF16_LE + "PRINT N'é'".encode("utf-16-le"),
        codecs.BOM_UTF16_BE + "PRINT N'é'".encode("utf-16-be"),
    ],
)
def test_utf8_or_utf16_with_a_byte_order_mark(data: bytes) -> None:
    assert decode(data) == "PRINT N'é'"


def test_an_encoding_sqlcmd_does_not_read_is_refused_clearly() -> None:
    with pytest.raises(SourceError, match="save it as UTF-8"):
        decode(b"PRINT '\xe9'")


def test_names_strings_numbers_and_binary() -> None:
    tokens = tokenize(
        "[//AWDB/1DBSample/Request:Msg]] x] \"quo\"\"ted\" N'it''s\nmulti' 'x' 0x1F 12 1.50 2e3"
        " @v @@ROWCOUNT status"
    )
    kinds = [(t.kind, t.value) for t in tokens[:-1]]
    assert kinds == [
        (Kind.QUOTED, "//AWDB/1DBSample/Request:Msg] x"),
        (Kind.QUOTED, 'quo"ted'),
        (Kind.NSTRING, "it's\nmulti"),
        (Kind.STRING, "x"),
        (Kind.BINARY, b"\x1f"),
        (Kind.INTEGER, 12),
        (Kind.DECIMAL, Decimal("1.50")),
        (Kind.FLOAT, 2000.0),
        (Kind.VARIABLE, "@v"),
        (Kind.SYSTEM, "@@ROWCOUNT"),
        (Kind.NAME, "status"),
    ]
    assert tokens[-1].kind is Kind.END


def test_nested_comments_and_line_numbers() -> None:
    tokens = tokenize("/* a /* b */ c */ SELECT -- x\n  1", first_line=10)
    assert [(t.text, t.line, t.column) for t in tokens[:-1]] == [("SELECT", 10, 19), ("1", 11, 3)]


@pytest.mark.parametrize(
    ("text", "number", "message"),
    [
        ("SELECT 'abc", 105, "Unclosed quotation mark after the character string 'abc'."),
        ("SELECT [abc", 105, "Unclosed quotation mark"),
        ("/* a /* b */", 113, "Missing end comment mark '*/'."),
    ],
)
def test_unclosed_strings_and_comments(text: str, number: int, message: str) -> None:
    from ssb.tsql import SqlError

    with pytest.raises(SqlError) as caught:
        tokenize(text)
    assert caught.value.number == number
    assert message in caught.value.text
