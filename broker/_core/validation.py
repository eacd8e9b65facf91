"""Message body validation, as a message type declares it.

NONE accepts any bytes; EMPTY accepts only an empty body; WELL_FORMED_XML needs a
body that parses as XML (UTF-8 or a declared encoding, one root element);
VALID_JSON needs UTF-8 JSON. A failure names the rule and the parser's reason.
"""

from __future__ import annotations

import json
from xml.parsers import expat

from ssb.protocol import ErrorCode

from .._errors import BrokerError


def validate_body(message_type: str, validation: str, body: bytes) -> None:
    """Raise VALIDATION_FAILED if `body` breaks the message type's validation."""
    if validation == "NONE":
        return
    if validation == "EMPTY":
        if body:
            raise _failed(message_type, validation, f"the body has {len(body)} bytes")
        return
    if validation == "WELL_FORMED_XML":
        parser = expat.ParserCreate()
        try:
            parser.Parse(body, True)
        except expat.ExpatError as exc:
            raise _failed(message_type, validation, str(exc)) from None
        return
    if validation == "VALID_JSON":
        try:
            json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise _failed(message_type, validation, str(exc)) from None
        return
    raise AssertionError(f"unknown validation {validation!r}")


def _failed(message_type: str, validation: str, reason: str) -> BrokerError:
    return BrokerError(
        ErrorCode.VALIDATION_FAILED,
        f"message body does not satisfy VALIDATION = {validation} of message type "
        f"'{message_type}': {reason}",
    )
