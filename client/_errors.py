"""Errors the client raises.

`BrokerError` is the root of everything the broker reports (with its stable
`.code`) and of connection failures (`ConnectionLostError`, `.code` None).
Subclasses group codes by what a caller does about them. Misuse of the client
itself (a wrong argument type caught before anything is sent) raises the usual
`TypeError` / `ValueError`.
"""

from __future__ import annotations

from typing import Final

from ssb.protocol import ErrorCode


class BrokerError(Exception):
    """An error reported by the broker (`code` set) or a failed connection."""

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return f"[{self.code.value} {self.code.name}] {self.message}" if self.code else self.message


class NotFoundError(BrokerError):
    """A named object, conversation or group does not exist."""


class AlreadyExistsError(BrokerError):
    """An object of that name already exists."""


class InUseError(BrokerError):
    """The object is still used by others and cannot be dropped."""


class InvalidArgumentError(BrokerError):
    """The request was well formed but its arguments break a rule."""


class ContractViolationError(InvalidArgumentError):
    """The message type is not allowed by the contract, or not for this side."""


class ValidationError(InvalidArgumentError):
    """A message body does not satisfy its message type's validation."""


class ConversationEndedError(BrokerError):
    """The conversation has ended (or its far side has) and cannot take this."""


class QueueDisabledError(BrokerError):
    """The queue is OFF (for example after poison message detection)."""


class SqlError(InvalidArgumentError):
    """A table statement was refused (not supported, not translatable) or failed (a
    constraint, a missing table); nothing of it was applied."""


class TransactionError(BrokerError):
    """Commit/rollback without a transaction, or begin inside one."""


class TransactionRolledBackError(TransactionError):
    """The transaction was rolled back and none of it applied (for example the connection
    dropped before its commit reached the broker); it is safe to run it again."""


class OutcomeUnknownError(TransactionError):
    """After a lost connection the broker can no longer say whether the commit happened:
    it was longer ago than the broker's outcome window. Check the data itself."""


class AnswerLostError(TransactionError):
    """A statement outside a transaction was applied, but its answer (a value it returned)
    was lost with the connection; inside `run_transaction` that cannot happen."""


class LockTimeoutError(BrokerError):
    """A conversation group stayed locked by another transaction too long."""


class LoginFailedError(BrokerError):
    """The broker refused the user name or password."""


class PermissionDeniedError(BrokerError):
    """The login may not do this."""


class MessageTooLargeError(InvalidArgumentError):
    """A body exceeds the broker's max_message_size, or a request the 64 MiB frame limit.
    Nothing was sent."""


class QueueFullError(BrokerError):
    """A SEND (or its COMMIT) would take a queue past its max_messages / max_bytes quota;
    nothing of it was applied. Receive from the queue, or raise its quota."""


class DiskFullError(BrokerError):
    """The broker refuses new messages while its disk is (nearly) full or its store cannot
    write; RECEIVE and END CONVERSATION still work. It accepts them again by itself."""


class ProtocolViolationError(BrokerError):
    """The broker and client disagree about the wire protocol."""


class InternalBrokerError(BrokerError):
    """The broker hit a bug; it logged it and the session goes on."""


class ConnectionLostError(BrokerError):
    """The connection to the broker failed or closed."""


class TLSError(ConnectionLostError):
    """TLS with the broker failed: its certificate is not the one the URL trusts."""


_BY_CODE: dict[ErrorCode, type[BrokerError]] = {
    ErrorCode.ALREADY_EXISTS: AlreadyExistsError,
    ErrorCode.IN_USE: InUseError,
    ErrorCode.BAD_ARGUMENT: InvalidArgumentError,
    ErrorCode.INVALID_DEFINITION: InvalidArgumentError,
    ErrorCode.SYSTEM_OBJECT: InvalidArgumentError,
    ErrorCode.MESSAGE_TYPE_NOT_IN_CONTRACT: ContractViolationError,
    ErrorCode.WRONG_DIRECTION: ContractViolationError,
    ErrorCode.CONTRACT_NOT_ACCEPTED: ContractViolationError,
    ErrorCode.VALIDATION_FAILED: ValidationError,
    ErrorCode.CONVERSATION_ENDED: ConversationEndedError,
    ErrorCode.QUEUE_DISABLED: QueueDisabledError,
    ErrorCode.NO_TRANSACTION: TransactionError,
    ErrorCode.TRANSACTION_ACTIVE: TransactionError,
    ErrorCode.LOCK_TIMEOUT: LockTimeoutError,
    ErrorCode.TOO_MANY_LOCKS: TransactionError,
    ErrorCode.TOO_MANY_TRANSACTIONS: TransactionError,
    ErrorCode.TRANSACTION_RESOLVED: TransactionRolledBackError,
    ErrorCode.UNKNOWN_SAVEPOINT: TransactionError,
    ErrorCode.LOGIN_FAILED: LoginFailedError,
    ErrorCode.PERMISSION_DENIED: PermissionDeniedError,
    ErrorCode.SQL_ERROR: SqlError,
    ErrorCode.MESSAGE_TOO_LARGE: MessageTooLargeError,
    ErrorCode.QUEUE_FULL: QueueFullError,
    ErrorCode.DISK_FULL: DiskFullError,
    ErrorCode.STORE_FAILED: DiskFullError,
}


def error_for(code: ErrorCode, message: str) -> BrokerError:
    """The client exception for a code the broker reported."""
    cls = _BY_CODE.get(code)
    if cls is None:
        if 2000 <= code < 4000 and code.name.startswith("UNKNOWN"):
            cls = NotFoundError
        elif 1000 <= code < 2000:
            cls = ProtocolViolationError
        else:
            cls = InternalBrokerError
    return cls(message, code)


# what a broker answers a login with when the fault is its own, for now: not a refusal
_NOT_NOW: Final = frozenset(
    {ErrorCode.INTERNAL_ERROR, ErrorCode.SHUTTING_DOWN, ErrorCode.STORE_FAILED}
)


def handshake_unfinished(port: int, exc: BaseException) -> ConnectionLostError:
    """The broker connected to on `port` did not finish the handshake (`exc`): often a
    client pointed at the broker-to-broker port."""
    return ConnectionLostError(
        f"the broker did not complete the handshake: {exc!r}; is {port} its client port"
        " (4021 by default, not the broker-to-broker port)?"
    )


def login_error(code: ErrorCode, message: str, where: str) -> BrokerError:
    """The exception for the broker at `where` (host:port) answering a login with an
    error: the refusal it says, or, where its own fault stopped it for now,
    ConnectionLostError (the URL's next address, or a reconnect's next try, may log in)."""
    if code in _NOT_NOW:
        return ConnectionLostError(f"the broker at {where} could not take the login now: {message}")
    return error_for(code, message)
