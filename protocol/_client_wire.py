"""The client wire: how a client session talks to the broker on the client port.

Both directions are frames of `_framing`. The client speaks first with a `Hello`
(protocol version, user, password, and the database to start in if not the default);
the broker answers with a `Welcome` naming its broker instance and the session's
database, or with an error frame and closes. After that the client sends
requests `[request_id, operation, arguments]` and the broker answers each, in
request order, with `[request_id, 0, result]` or `[request_id, 1, [code, text]]`.
Requests of one session are executed one after another, like statements of a SQL
session, so a client may pipeline many requests without waiting.

A received message travels as a list in `MESSAGE_COLUMNS` order: compact, and the
order is the contract between the two ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ._errors import ErrorCode, RemoteProtocolError
from ._framing import (
    DEFAULT_MAX_MESSAGE_SIZE,
    MAX_MESSAGE_SIZE_LIMIT,
    MAX_NESTING,
    check_nesting,
    is_container,
)

WIRE_VERSION: Final = 1
MAX_DATABASE_NAME: Final = 128
REPLY_OK: Final = 0
REPLY_ERROR: Final = 1

MESSAGE_COLUMNS: Final = (
    "status",
    "priority",
    "queuing_order",
    "conversation_group_id",
    "conversation_handle",
    "message_sequence_number",
    "service_name",
    "service_contract_name",
    "message_type_name",
    "validation",
    "message_body",
    "message_enqueue_time",
    "delivery_count",
    "dead_letter_reason",
)


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    user: str
    password: str
    database: str = ""  # the database the session starts in ("": the broker's default)

    def encode(self) -> dict[str, Any]:
        frame: dict[str, Any] = {
            "hello": self.version,
            "user": self.user,
            "password": self.password,
        }
        if self.database:
            frame["database"] = self.database
        return frame

    @classmethod
    def decode(cls, frame: Any) -> Hello:
        if not isinstance(frame, dict) or not isinstance(frame.get("hello"), int):
            raise RemoteProtocolError(
                "the first frame must be a hello {hello: version, user, password}",
                ErrorCode.HANDSHAKE_FAILED,
            )
        user, password = frame.get("user", ""), frame.get("password", "")
        database = frame.get("database", "")
        if not isinstance(user, str) or not isinstance(password, str):
            raise RemoteProtocolError(
                "hello user and password must be strings", ErrorCode.HANDSHAKE_FAILED
            )
        if not isinstance(database, str) or len(database) > MAX_DATABASE_NAME:
            raise RemoteProtocolError(
                f"hello database must be a name of at most {MAX_DATABASE_NAME} characters",
                ErrorCode.HANDSHAKE_FAILED,
            )
        return cls(frame["hello"], user, password, database)


@dataclass(frozen=True, slots=True)
class Welcome:
    version: int
    broker_instance: str
    server: str
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE  # the broker's limit on a body
    database: str = ""  # the database the session is in ("": a broker without databases)

    def encode(self) -> dict[str, Any]:
        frame = {
            "welcome": self.version,
            "broker_instance": self.broker_instance,
            "server": self.server,
            "max_message_size": self.max_message_size,
        }
        if self.database:
            frame["database"] = self.database
        return frame

    @classmethod
    def decode(cls, frame: Any) -> Welcome:
        if isinstance(frame, list) and len(frame) == 3 and frame[1] == REPLY_ERROR:
            code, text = _error_pair(frame[2])
            raise RemoteProtocolError(text, code)
        if not isinstance(frame, dict) or not isinstance(frame.get("welcome"), int):
            raise RemoteProtocolError(
                "the server did not answer the hello; is this the broker's client port"
                " (4021 by default) and not its broker-to-broker port?",
                ErrorCode.HANDSHAKE_FAILED,
            )
        limit = frame.get("max_message_size", DEFAULT_MAX_MESSAGE_SIZE)
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 0 < limit <= MAX_MESSAGE_SIZE_LIMIT
        ):
            raise RemoteProtocolError(
                f"the broker announced a max_message_size of {limit!r}", ErrorCode.HANDSHAKE_FAILED
            )
        database = frame.get("database", "")
        return cls(
            frame["welcome"],
            str(frame.get("broker_instance")),
            str(frame.get("server")),
            limit,
            database if isinstance(database, str) else "",
        )


@dataclass(frozen=True, slots=True)
class Request:
    request_id: int
    operation: str
    arguments: dict[str, Any]

    def encode(self) -> list[Any]:
        return [self.request_id, self.operation, self.arguments]

    @classmethod
    def decode(cls, frame: Any) -> Request:
        if (
            not isinstance(frame, list)
            or len(frame) != 3
            or not isinstance(frame[0], int)
            or not isinstance(frame[1], str)
            or not isinstance(frame[2], dict)
        ):
            raise RemoteProtocolError(
                "a request is [request_id:int, operation:str, arguments:map]",
                ErrorCode.MALFORMED_FRAME,
            )
        for value in frame[2].values():  # flat lists of scalars pass at C speed
            if type(value) is dict or (
                type(value) is list and any(map(is_container, map(type, value)))
            ):
                check_nesting(value, MAX_NESTING - 2)
        return cls(frame[0], frame[1], frame[2])


def encode_ok(request_id: int, result: object) -> list[Any]:
    return [request_id, REPLY_OK, result]


def encode_error(request_id: int, code: int, text: str) -> list[Any]:
    return [request_id, REPLY_ERROR, [int(code), text]]


def _error_pair(body: Any) -> tuple[ErrorCode, str]:
    if isinstance(body, list) and len(body) == 2 and type(body[0]) is int:
        number, text = body[0], str(body[1])
        try:
            return ErrorCode(number), text
        except ValueError:
            return ErrorCode.UNRECOGNISED_CODE, (
                f"the broker answered with error {number}, which this client does not know"
                f" (a newer broker's; upgrade the client): {text}"
            )
    raise RemoteProtocolError("malformed error reply", ErrorCode.MALFORMED_FRAME)


@dataclass(frozen=True, slots=True)
class Reply:
    request_id: int
    ok: bool
    result: Any
    code: ErrorCode | None = None
    text: str = ""

    @classmethod
    def decode(cls, frame: Any) -> Reply:
        if not isinstance(frame, list) or len(frame) != 3 or not isinstance(frame[0], int):
            raise RemoteProtocolError("a reply is [request_id, status, body]")
        if frame[1] == REPLY_OK:
            return cls(frame[0], True, frame[2])
        if frame[1] == REPLY_ERROR:
            code, text = _error_pair(frame[2])
            return cls(frame[0], False, None, code, text)
        raise RemoteProtocolError(f"unknown reply status {frame[1]!r}")
