"""Typed values, SQL Server's conversions and the XML type."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import pytest

from ssb.tsql import SqlError
from ssb.tsql import _types as t
from ssb.tsql._eval import typed_value
from ssb.tsql._xml import parse_xml, xml_exist, xml_nodes, xml_query

TEXT = "<RequestMsg>Message for Target service.</RequestMsg>"


def test_nvarchar_travels_as_utf16le_without_a_byte_order_mark() -> None:
    body = t.convert(t.Value("é<a/>", t.NVARCHAR), t.VARBINARY_MAX).data
    assert body == "é<a/>".encode("utf-16-le")
    back = t.convert(t.Value(body, t.VARBINARY_MAX), t.SqlType("NVARCHAR", 100))
    assert back.data == "é<a/>"


def test_varchar_travels_as_single_bytes() -> None:
    assert t.convert(t.Value("é€", t.VARCHAR), t.VARBINARY_MAX).data == b"\xe9\x80"
    assert t.convert(t.Value(b"\xe9\x80\x81", t.VARBINARY_MAX), t.VARCHAR).data == "é€\x81"


def test_xml_serialises_as_utf16le_with_a_byte_order_mark() -> None:
    document = t.convert(t.Value('<?xml version="1.0"?>' + TEXT, t.NVARCHAR), t.XML)
    assert t.to_bytes(document) == b"\xff\xfe" + TEXT.encode("utf-16-le")


@pytest.mark.parametrize(
    "body",
    [
        TEXT.encode("utf-16-le"),
        b"\xff\xfe" + TEXT.encode("utf-16-le"),
        TEXT.encode(),
        b"\xef\xbb\xbf" + TEXT.encode(),
        ('<?xml version="1.0" encoding="iso-8859-1"?><a>\xe9</a>').encode("latin-1"),
    ],
)
def test_a_body_casts_to_xml_in_every_encoding_sql_server_detects(body: bytes) -> None:
    document = t.convert(t.Value(body, t.VARBINARY_MAX), t.XML).data
    assert isinstance(document, t.Xml)
    assert not document.text.startswith("<?xml")


def test_a_body_that_is_not_well_formed_raises_sql_servers_xml_error() -> None:
    with pytest.raises(SqlError) as caught:
        t.convert(t.Value(b"<a><b></a>", t.VARBINARY_MAX), t.XML)
    assert caught.value.number == 9400
    assert caught.value.text.startswith("XML parsing: line 1, character")


def test_xml_fragments_as_the_xml_type_holds_them() -> None:
    assert parse_xml("<a/><b>x</b>text").text == "<a/><b>x</b>text"


def test_xml_methods_on_lxml_and_elementpath() -> None:
    document = parse_xml('<r xmlns="urn:x"><i n="1">a</i><i n="2">b</i></r>')
    prolog = 'declare default element namespace "urn:x"; '
    assert typed_value(document, prolog + "(/r/i/@n)[2]", "int").data == 2
    assert (
        typed_value(document, "declare namespace p='urn:x'; (/p:r/p:i)[1]", "nvarchar(10)").data
        == "a"
    )
    assert typed_value(document, prolog + "(/r/i)[3]", "int").data is None
    assert xml_exist(document, prolog + "/r/i[@n=2]") == 1
    assert xml_exist(document, prolog + "/r/j") == 0
    assert xml_query(document, prolog + "/r/i[1]").text == '<i xmlns="urn:x" n="1">a</i>'
    assert len(xml_nodes(document, prolog + "/r/i")) == 2
    with pytest.raises(SqlError, match="singleton"):
        typed_value(document, prolog + "/r/i", "int")


@pytest.mark.parametrize(
    ("value", "target", "expected"),
    [
        (t.Value(" 42 ", t.VARCHAR), t.INT, 42),
        (t.Value("1", t.VARCHAR), t.BIT, 1),
        (t.Value(7, t.INT), t.SqlType("NVARCHAR", 30), "7"),
        (t.Value(Decimal("1.5"), t.SqlType("DECIMAL", None, 10, 2)), t.NVARCHAR, "1.50"),
        (t.Value("abcdef", t.NVARCHAR), t.SqlType("NVARCHAR", 3), "abc"),
        (
            t.Value("2024-05-06 07:08:09.123", t.VARCHAR),
            t.DATETIME,
            dt.datetime(2024, 5, 6, 7, 8, 9, 123000),
        ),
        (t.Value(1, t.INT), t.VARBINARY_MAX, b"\x00\x00\x00\x01"),
    ],
)
def test_conversions(value: t.Value, target: t.SqlType, expected: object) -> None:
    assert t.convert(value, target).data == expected


def test_uniqueidentifier_as_text_and_bytes() -> None:
    handle = uuid.UUID("6f9619ff-8b86-d011-b42d-00c04fc964ff")
    assert t.to_text(t.Value(handle, t.GUID)) == "6F9619FF-8B86-D011-B42D-00C04FC964FF"
    assert t.to_bytes(t.Value(handle, t.GUID)) == handle.bytes_le
    assert (
        t.convert(t.Value("{6F9619FF-8B86-D011-B42D-00C04FC964FF}", t.VARCHAR), t.GUID).data
        == handle
    )


@pytest.mark.parametrize(
    ("value", "target", "number"),
    [
        (t.Value("abc", t.VARCHAR), t.INT, 245),
        (t.Value("abc", t.VARCHAR), t.GUID, 8169),
        (t.Value("not a date", t.VARCHAR), t.DATETIME, 241),
        (t.Value(300, t.INT), t.SqlType("TINYINT"), 8115),
        (t.Value(uuid.uuid4(), t.GUID), t.INT, 529),
    ],
)
def test_failed_conversions_raise_sql_servers_errors(
    value: t.Value, target: t.SqlType, number: int
) -> None:
    with pytest.raises(SqlError) as caught:
        t.convert(value, target)
    assert caught.value.number == number


def test_display_as_sqlcmd_shows_values() -> None:
    assert t.display(t.Value(b"\x01\xab", t.VARBINARY_MAX)) == "0x01AB"
    assert t.display(t.Value(None, t.INT)) == "NULL"
    assert (
        t.display(t.Value(dt.datetime(2024, 1, 2, 3, 4, 5, 678000), t.DATETIME))
        == "2024-01-02 03:04:05.678"
    )
