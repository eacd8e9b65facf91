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


DATETIME_TEXT = t.SqlType("VARCHAR", 30)


@pytest.mark.parametrize(
    ("text", "held"),
    [  # SQL Server's own examples: DATETIME holds 1/300 seconds, shown .000, .003 or .007
        ("2024-05-06 23:59:59.999", dt.datetime(2024, 5, 7)),
        ("2024-05-06 07:08:09.998", dt.datetime(2024, 5, 6, 7, 8, 9, 997000)),
        ("2024-05-06 07:08:09.995", dt.datetime(2024, 5, 6, 7, 8, 9, 997000)),
        ("2024-05-06 07:08:09.994", dt.datetime(2024, 5, 6, 7, 8, 9, 993000)),
        ("2024-05-06 07:08:09.992", dt.datetime(2024, 5, 6, 7, 8, 9, 993000)),
        ("2024-05-06 07:08:09.991", dt.datetime(2024, 5, 6, 7, 8, 9, 990000)),
        ("2024-05-06 07:08:09.002", dt.datetime(2024, 5, 6, 7, 8, 9, 3000)),
        ("2024-05-06 07:08:09.001", dt.datetime(2024, 5, 6, 7, 8, 9)),
        ("2024-05-06 07:08:09.0055", dt.datetime(2024, 5, 6, 7, 8, 9, 7000)),
    ],
)
def test_datetime_rounds_to_its_three_hundredths_of_a_second(text: str, held: dt.datetime) -> None:
    assert t.convert(t.Value(text, DATETIME_TEXT), t.DATETIME).data == held
    precise = t.convert(t.Value(text, DATETIME_TEXT), t.DATETIME2)  # DATETIME2 keeps it all
    assert precise.data == dt.datetime.fromisoformat(text)
    assert t.convert(precise, t.DATETIME).data == held


def test_datetime_rounding_past_its_range_and_smalldatetime_to_the_minute() -> None:
    with pytest.raises(SqlError) as caught:
        t.convert(t.Value("9999-12-31 23:59:59.999", DATETIME_TEXT), t.DATETIME)
    assert caught.value.number == 242
    small = t.SqlType("SMALLDATETIME")
    assert t.convert(t.Value("2024-05-06 07:08:29.998", DATETIME_TEXT), small).data == (
        dt.datetime(2024, 5, 6, 7, 8)
    )
    assert t.convert(t.Value("2024-05-06 07:08:29.999", DATETIME_TEXT), small).data == (
        dt.datetime(2024, 5, 6, 7, 9)
    )


def test_datetime_and_numbers_convert_as_days_since_1900() -> None:
    evening = t.convert(t.Value("2024-05-06 18:00", DATETIME_TEXT), t.DATETIME)
    assert t.convert(evening, t.FLOAT).data == 45416.75
    assert t.convert(evening, t.SqlType("DECIMAL", None, 12, 4)).data == Decimal("45416.7500")
    assert t.convert(evening, t.INT).data == 45417  # rounded: after noon, the next day
    morning = t.convert(t.Value("2024-05-06 11:59:59.997", DATETIME_TEXT), t.DATETIME)
    assert t.convert(morning, t.INT).data == 45416
    tick = t.convert(t.Value("1900-01-01 00:00:00.003", DATETIME_TEXT), t.DATETIME)
    assert t.convert(tick, t.FLOAT).data == 1 / (86400 * 300)
    assert t.convert(t.Value(-0.5, t.FLOAT), t.DATETIME).data == dt.datetime(1899, 12, 31, 12)
    assert t.convert(t.Value(45416.75, t.FLOAT), t.DATETIME).data == dt.datetime(2024, 5, 6, 18)
    assert t.convert(t.Value(2, t.INT), t.SqlType("SMALLDATETIME")).data == dt.datetime(1900, 1, 3)
    for value, target in [
        (t.Value(dt.datetime(2024, 5, 6), t.DATETIME2), t.FLOAT),
        (t.Value(dt.datetime(2024, 5, 6), t.DATETIME2), t.INT),
        (t.Value(1, t.INT), t.SqlType("DATE")),
        (t.Value(1.5, t.FLOAT), t.DATETIME2),
    ]:
        with pytest.raises(SqlError) as caught:
            t.convert(value, target)
        assert caught.value.number == 529


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
