"""The ssb client: program the broker from Python.

conn = await client.connect("ssb://admin:secret@127.0.0.1:4021")
conn = client.connect_sync("ssb://127.0.0.1:4021")   # same methods, blocking
"""

from __future__ import annotations

from ._calls_tables import Result
from ._connection import Connection, connect
from ._errors import (
    AlreadyExistsError,
    AnswerLostError,
    BrokerError,
    ConnectionLostError,
    ContractViolationError,
    ConversationEndedError,
    DiskFullError,
    InternalBrokerError,
    InUseError,
    InvalidArgumentError,
    LockTimeoutError,
    LoginFailedError,
    MessageTooLargeError,
    NotFoundError,
    OutcomeUnknownError,
    PermissionDeniedError,
    ProtocolViolationError,
    QueueDisabledError,
    QueueFullError,
    SqlError,
    TLSError,
    TransactionError,
    TransactionRolledBackError,
    ValidationError,
)
from ._functions import function_name, load_function
from ._message import (
    DIALOG_TIMER,
    END_DIALOG,
    ERROR,
    EVENT_NOTIFICATION,
    POST_EVENT_NOTIFICATION,
    Message,
)
from ._scheduler import (
    SCHEDULER_PROCEDURE,
    SCHEDULER_READERS,
    Scheduler,
    SchedulerNames,
    SyncScheduler,
    TaskOutcome,
)
from ._sync import SyncConnection, connect_sync
from ._task import ProcedureFailed, TaskContext
from ._url import local_url, url_addresses

__all__ = [
    "DIALOG_TIMER",
    "END_DIALOG",
    "ERROR",
    "EVENT_NOTIFICATION",
    "POST_EVENT_NOTIFICATION",
    "SCHEDULER_PROCEDURE",
    "SCHEDULER_READERS",
    "AlreadyExistsError",
    "AnswerLostError",
    "BrokerError",
    "Connection",
    "ConnectionLostError",
    "ContractViolationError",
    "ConversationEndedError",
    "DiskFullError",
    "InUseError",
    "InternalBrokerError",
    "InvalidArgumentError",
    "LockTimeoutError",
    "LoginFailedError",
    "Message",
    "MessageTooLargeError",
    "NotFoundError",
    "OutcomeUnknownError",
    "PermissionDeniedError",
    "ProcedureFailed",
    "ProtocolViolationError",
    "QueueDisabledError",
    "QueueFullError",
    "Result",
    "Scheduler",
    "SchedulerNames",
    "SqlError",
    "SyncConnection",
    "SyncScheduler",
    "TLSError",
    "TaskContext",
    "TaskOutcome",
    "TransactionError",
    "TransactionRolledBackError",
    "ValidationError",
    "connect",
    "connect_sync",
    "function_name",
    "load_function",
    "local_url",
    "url_addresses",
]
