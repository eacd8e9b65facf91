"""WELL_FORMED_XML accepts what SQL Server's XML parser accepts: the bodies T-SQL sends
(NVARCHAR as UTF-16LE without a byte-order mark, XML as UTF-16LE with one) and UTF-8."""

from __future__ import annotations

import pytest

from ssb.broker._core.validation import validate_body
from ssb.broker._errors import BrokerError

DOCUMENT = "<RequestMsg>Message for Target service. é</RequestMsg>"


@pytest.mark.parametrize(
    "body",
    [
        DOCUMENT.encode("utf-16-le"),
        b"\xff\xfe" + DOCUMENT.encode("utf-16-le"),
        b"\xfe\xff" + DOCUMENT.encode("utf-16-be"),
        DOCUMENT.encode(),
        '<?xml version="1.0" encoding="utf-16"?><a/>'.encode("utf-16-le"),
    ],
)
def test_well_formed_xml_in_the_encodings_sql_server_sends(body: bytes) -> None:
    validate_body("m", "WELL_FORMED_XML", body)


def test_a_body_that_is_not_xml_is_refused_in_utf16_too() -> None:
    with pytest.raises(BrokerError, match="WELL_FORMED_XML"):
        validate_body("m", "WELL_FORMED_XML", "<a><b></a>".encode("utf-16-le"))
