"""The daemon's log formats: text lines no one can forge, JSON a machine can parse."""

from __future__ import annotations

import json
import logging

from ssb.broker._logging import TEXT_FORMAT, JsonFormatter, TextFormatter


def record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("ssb.core", logging.INFO, __file__, 1, message, args, None)


def test_a_name_with_a_line_break_cannot_forge_a_text_line() -> None:
    line = TextFormatter(TEXT_FORMAT).format(
        record("queue %s disabled", "Q\n2026-01-01 00:00:00,000 ERROR ssb.core: forged")
    )
    assert "\n" not in line
    assert "Q\\x0a2026-01-01" in line


def test_plain_text_and_other_scripts_are_left_alone() -> None:
    line = TextFormatter(TEXT_FORMAT).format(record("queue %s enabled", "Bestellungen-é"))
    assert line.endswith("INFO ssb.core: queue Bestellungen-é enabled")


def test_json_lines_carry_the_message_with_its_arguments() -> None:
    entry = json.loads(JsonFormatter().format(record("queue %s disabled", "Q\nx")))
    assert entry["message"] == "queue Q\nx disabled"
    assert entry["level"] == "INFO" and entry["logger"] == "ssb.core"
    assert entry["time"].endswith("Z")
