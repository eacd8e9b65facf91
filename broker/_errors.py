"""Errors the broker reports to a client: a stable code and words a person can act on."""

from __future__ import annotations

from ssb.protocol import ErrorCode


class BrokerError(Exception):
    """An error in what the client asked for; the session goes on."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def not_found(code: ErrorCode, kind: str, name: object, hint: str = "") -> BrokerError:
    text = f"{kind} '{name}' does not exist"
    return BrokerError(code, f"{text}; {hint}" if hint else text)


def bad_argument(message: str) -> BrokerError:
    return BrokerError(ErrorCode.BAD_ARGUMENT, message)
