"""Error codes and the protocol package's exception hierarchy.

Codes are stable: clients match on them, so a code is never renumbered or reused.
The 1xxx range is for the wire itself (bad frames, handshakes, integrity), 2xxx for
catalog objects, 3xxx for conversations, 4xxx for queues and receiving, 5xxx for
transactions and locks, 6xxx for security, 9xxx for the broker's own faults.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    # wire
    MALFORMED_FRAME = 1001
    FRAME_TOO_LARGE = 1002
    UNKNOWN_OPERATION = 1003
    BAD_ARGUMENT = 1004
    HANDSHAKE_FAILED = 1005
    INTEGRITY_CHECK_FAILED = 1006
    UNEXPECTED_FRAME = 1007
    # (a client's own) the broker answered with a code this client does not know, a newer
    # broker's: its number leads the message
    UNRECOGNISED_CODE = 1008
    # catalog
    UNKNOWN_MESSAGE_TYPE = 2001
    UNKNOWN_CONTRACT = 2002
    UNKNOWN_QUEUE = 2003
    UNKNOWN_SERVICE = 2004
    UNKNOWN_ROUTE = 2005
    UNKNOWN_PRIORITY = 2006
    UNKNOWN_EVENT_NOTIFICATION = 2007
    UNKNOWN_VIEW = 2008
    ALREADY_EXISTS = 2010
    IN_USE = 2011
    INVALID_DEFINITION = 2012
    SYSTEM_OBJECT = 2013
    UNKNOWN_CERTIFICATE = 2014
    UNKNOWN_LOGIN = 2015
    UNKNOWN_REMOTE_SERVICE_BINDING = 2016
    UNKNOWN_DATABASE = 2017
    UNKNOWN_PROCEDURE = 2018
    # conversations
    UNKNOWN_CONVERSATION = 3001
    CONVERSATION_ENDED = 3002
    MESSAGE_TYPE_NOT_IN_CONTRACT = 3003
    WRONG_DIRECTION = 3004
    CONTRACT_NOT_ACCEPTED = 3005
    VALIDATION_FAILED = 3006
    UNKNOWN_CONVERSATION_GROUP = 3007
    MESSAGE_TOO_LARGE = 3008
    # queues and receiving
    QUEUE_DISABLED = 4001
    QUEUE_FULL = 4002
    # transactions and locks
    NO_TRANSACTION = 5001
    TRANSACTION_ACTIVE = 5002
    LOCK_TIMEOUT = 5003
    TOO_MANY_LOCKS = 5004
    TOO_MANY_TRANSACTIONS = 5005
    TRANSACTION_RESOLVED = 5006  # its outcome was given to a reconnecting client: never again
    UNKNOWN_SAVEPOINT = 5007
    # security
    LOGIN_FAILED = 6001
    PERMISSION_DENIED = 6002
    # users' tables
    SQL_ERROR = 7001  # a table statement was refused or failed (its message says why)
    # broker faults
    INTERNAL_ERROR = 9001
    SHUTTING_DOWN = 9002
    DISK_FULL = 9003
    STORE_FAILED = 9004


class ProtocolError(Exception):
    """Root of the protocol package's errors; carries the code to send back."""

    code: ErrorCode = ErrorCode.MALFORMED_FRAME

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class LocalProtocolError(ProtocolError):
    """We tried to do something the protocol does not allow."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol does not allow."""


class IntegrityError(RemoteProtocolError):
    """A fragment's sealed MD5 signature did not match its content."""

    code = ErrorCode.INTEGRITY_CHECK_FAILED
