"""The seed-000 scheduler: a conversation as a scheduler handle, tasks run by activated
readers of the target queue.

Theory of operation. A scheduler named N is made of two services and their queues:
`N/InitiatorService` on `N/InitiatorQueue` and `N/TargetService` on
`N/TargetQueue`, which has internal activation with `run_tasks` below as its
procedure, and the contract `N/AsyncContract` (`N/AsyncSent` sent by the
initiator, `N/AsyncDone` sent by the target; both VALID_JSON). `get_scheduler`
begins one dialog: its handle is the scheduler. `exec_async` logs the task in the
broker's execution log (`log_task`) and sends it as AsyncSent
{"log_id", "function": "package.module:function", "args", "kwargs"}. Activated
readers RECEIVE one message at a time outside a transaction, so several readers run
tasks of the same scheduler at once; each logs start and end and answers AsyncDone
{"log_id", "ok", "error", "result"}. `synchronize` RECEIVEs AsyncDone on the
scheduler's own conversation until every task sent so far has answered; `release`
ends the conversation.

With `max_running = k` a scheduler never has more than k tasks sent and unanswered:
exec_async first collects an answer when k are out (the seed's caller-side
semaphore). Schedulers sharing the target queue are served fairly: every
scheduler's conversation is its own conversation group, and RECEIVE takes, within
a priority level, the group whose oldest message has waited longest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from ssb.protocol import ErrorCode

from . import _calls as calls
from ._errors import AlreadyExistsError, ConversationEndedError, NotFoundError
from ._functions import function_name, load_function
from ._message import Message
from ._session import AsyncSession, Steps, SyncSession, run_steps, run_steps_sync
from ._url import parse_url

Session = TypeVar("Session", AsyncSession, SyncSession)

# the target queue's activation procedure, `run_tasks` below; stored as written in
# queues' activation, so it keeps its module's path
SCHEDULER_PROCEDURE: Final = "ssb.client._scheduler:run_tasks"
SCHEDULER_READERS: Final = 5  # activated readers of a new scheduler's target queue
RECEIVE_WAIT: Final = 5.0  # how long an idle reader waits for the next task
_SENT: Final = "AsyncSent"
_DONE: Final = "AsyncDone"


@dataclass(frozen=True, slots=True)
class SchedulerNames:
    """The catalog objects of the scheduler called `name`."""

    name: str

    @property
    def sent(self) -> str:
        return f"{self.name}/{_SENT}"

    @property
    def done(self) -> str:
        return f"{self.name}/{_DONE}"

    @property
    def contract(self) -> str:
        return f"{self.name}/AsyncContract"

    @property
    def initiator_queue(self) -> str:
        return f"{self.name}/InitiatorQueue"

    @property
    def target_queue(self) -> str:
        return f"{self.name}/TargetQueue"

    @property
    def initiator_service(self) -> str:
        return f"{self.name}/InitiatorService"

    @property
    def target_service(self) -> str:
        return f"{self.name}/TargetService"

    def install_calls(self, activation: dict[str, Any]) -> list[calls.Call[None]]:
        """The requests that create the scheduler's objects, its target queue with
        `activation` (internal activation of `run_tasks`, or OFF for an external
        activator such as the Spark bridge)."""
        return [
            calls.create_message_type(self.sent, "VALID_JSON"),
            calls.create_message_type(self.done, "VALID_JSON"),
            calls.create_contract(self.contract, {self.sent: "INITIATOR", self.done: "TARGET"}),
            calls.create_queue(self.initiator_queue),
            calls.create_queue(self.target_queue, activation=activation),
            calls.create_service(self.initiator_service, self.initiator_queue),
            calls.create_service(self.target_service, self.target_queue, [self.contract]),
        ]


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """One task's answer: `result` is the function's return value (JSON, or its repr)."""

    log_id: int
    ok: bool
    error: str | None
    result: Any


# ---- task messages (shared by both schedulers and the procedure) -------------------


def _payload(spec: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    payload = {"function": spec, "args": list(args), "kwargs": kwargs}
    try:
        json.dumps(payload)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"task arguments must be JSON values: {exc}") from None
    return payload


def _describe(payload: dict[str, Any]) -> str:
    parts = [json.dumps(a) for a in payload["args"]]
    parts += [f"{k}={json.dumps(v)}" for k, v in payload["kwargs"].items()]
    return f"{payload['function']}({', '.join(parts)})"


def _outcome(message: Message, names: SchedulerNames) -> TaskOutcome:
    if message.message_type_name == names.done:
        body = json.loads(message.message_body)
        return TaskOutcome(
            int(body["log_id"]), bool(body["ok"]), body.get("error"), body.get("result")
        )
    what = message.text() if message.is_error else message.message_type_name
    raise ConversationEndedError(
        f"scheduler conversation {message.conversation_handle} ended by the target: {what}",
        ErrorCode.CONVERSATION_ENDED,
    )


class _Tasks(Generic[Session]):
    """What both schedulers track (tasks out, answers in), and what each of their
    methods asks of the broker, as steps (see `_session.Steps`), on their connection
    `conn` (async or blocking)."""

    def __init__(
        self, conn: Session, names: SchedulerNames, handle: uuid.UUID, max_running: int | None
    ) -> None:
        if max_running is not None and max_running < 1:
            raise ValueError("max_running must be >= 1 (or None for no limit)")
        self.conn: Session = conn
        self.names = names
        self.handle = handle
        self.max_running = max_running
        self._outstanding: set[int] = set()
        self._finished: list[TaskOutcome] = []
        self._released = False

    @property
    def outstanding(self) -> int:
        """Tasks sent whose AsyncDone has not been received yet."""
        return len(self._outstanding)

    def _exec(
        self, task: str | Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Steps[int]:
        if self._released:
            raise ConversationEndedError(
                f"scheduler {self.handle} was released", ErrorCode.CONVERSATION_ENDED
            )
        payload = _payload(function_name(task), args, kwargs)
        while self.max_running is not None and len(self._outstanding) >= self.max_running:
            yield from self._collect(None)
        log_id: int = yield calls.log_task(_describe(payload), self.handle)
        yield calls.send(self.handle, self.names.sent, json.dumps({"log_id": log_id, **payload}))
        self._outstanding.add(log_id)
        return log_id

    def _collect(self, timeout: float | None) -> Steps[None]:
        messages: list[Message] = yield calls.receive(
            self.names.initiator_queue, top=1, timeout=timeout, conversation_handle=self.handle
        )
        if not messages:
            raise TimeoutError(
                f"{len(self._outstanding)} task(s) of scheduler {self.handle} did not finish "
                f"within {timeout} s"
            )
        outcome = _outcome(messages[0], self.names)
        self._outstanding.discard(outcome.log_id)
        self._finished.append(outcome)

    def _synchronize(self, timeout: float | None) -> Steps[list[TaskOutcome]]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._outstanding:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            yield from self._collect(left)
        done, self._finished = self._finished, []
        return done

    def _release(self) -> Steps[None]:
        if self._released:
            return
        self._released = True
        with contextlib.suppress(ConversationEndedError, NotFoundError):
            yield calls.end_conversation(self.handle)


class Scheduler(_Tasks[AsyncSession]):
    """A scheduler handle (async); get one with `await conn.get_scheduler()`."""

    async def exec_async(self, task: str | Callable[..., Any], /, *args: Any, **kwargs: Any) -> int:
        """Queue `task(*args, **kwargs)` to run on an activated reader.

        Args:
            task: 'package.module:function' or an importable function; arguments
                must be JSON values.
        Returns:
            The task's execution log id.
        """
        return await run_steps(self.conn, self._exec(task, args, kwargs))

    async def synchronize(self, timeout: float | None = None) -> list[TaskOutcome]:
        """Wait until every task sent so far has finished.

        Returns:
            The outcomes that arrived since the last synchronize, in arrival order.
        Raises:
            TimeoutError: `timeout` seconds passed first (the tasks keep running).
            ConversationEndedError: the target ended the scheduler's conversation.
        """
        return await run_steps(self.conn, self._synchronize(timeout))

    async def release(self) -> None:
        """End the scheduler's conversation (tasks still running finish unobserved)."""
        await run_steps(self.conn, self._release())

    async def __aenter__(self) -> Scheduler:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


class SyncScheduler(_Tasks[SyncSession]):
    """A scheduler handle on a blocking connection: `conn.get_scheduler()`."""

    def exec_async(self, task: str | Callable[..., Any], /, *args: Any, **kwargs: Any) -> int:
        """Queue `task(*args, **kwargs)` to run on an activated reader.

        Args:
            task: 'package.module:function' or an importable function; arguments
                must be JSON values.
        Returns:
            The task's execution log id.
        """
        return run_steps_sync(self.conn, self._exec(task, args, kwargs))

    def synchronize(self, timeout: float | None = None) -> list[TaskOutcome]:
        """Wait until every task sent so far has finished.

        Returns:
            The outcomes that arrived since the last synchronize, in arrival order.
        Raises:
            TimeoutError: `timeout` seconds passed first (the tasks keep running).
            ConversationEndedError: the target ended the scheduler's conversation.
        """
        return run_steps_sync(self.conn, self._synchronize(timeout))

    def release(self) -> None:
        """End the scheduler's conversation (tasks still running finish unobserved)."""
        run_steps_sync(self.conn, self._release())

    def __enter__(self) -> SyncScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# ---- installing and getting a scheduler ----------------------------------------------


def _internal(max_queue_readers: int, execute_as: str) -> dict[str, Any]:
    """The target queue's activation when the broker's own workers run the tasks."""
    return {
        "status": "ON",
        "procedure": SCHEDULER_PROCEDURE,
        "max_queue_readers": max_queue_readers,
        "execute_as": execute_as,
    }


def _install(url: str, name: str, max_queue_readers: int, execute_as: str | None) -> Steps[None]:
    user = parse_url(url).user if execute_as is None else execute_as
    for request in SchedulerNames(name).install_calls(_internal(max_queue_readers, user)):
        with contextlib.suppress(AlreadyExistsError):
            yield request


def _begin(
    url: str, name: str, install: bool, max_queue_readers: int, execute_as: str | None
) -> Steps[uuid.UUID]:
    """Install scheduler `name` if asked and missing, then begin its conversation."""
    names = SchedulerNames(name)
    if install:
        services: list[dict[str, Any]] = yield calls.view("services")
        if not any(row["name"] == names.target_service for row in services):
            yield from _install(url, name, max_queue_readers, execute_as)
    handle: uuid.UUID = yield calls.begin_dialog(
        names.initiator_service, names.target_service, names.contract
    )
    return handle


async def install_scheduler(
    conn: AsyncSession,
    name: str = "Scheduler",
    *,
    max_queue_readers: int = SCHEDULER_READERS,
    execute_as: str | None = None,
) -> None:
    """Create the scheduler's message types, contract, queues and services if missing.

    Args:
        name: the scheduler's name (prefix of its objects' names).
        max_queue_readers: activated readers of its target queue (existing queues keep
            theirs; change it with alter_queue).
        execute_as: the user the readers run as (default: this connection's user).
    """
    await run_steps(conn, _install(conn.url, name, max_queue_readers, execute_as))


async def get_scheduler(
    conn: AsyncSession,
    name: str = "Scheduler",
    *,
    max_running: int | None = None,
    install: bool = True,
    max_queue_readers: int = SCHEDULER_READERS,
    execute_as: str | None = None,
) -> Scheduler:
    """Begin a scheduler conversation (the seed's GetScheduler).

    Args:
        max_running: at most this many of its tasks sent and unfinished at once.
        install: create the scheduler's objects first if they are missing (see
            `install_scheduler`, which takes max_queue_readers and execute_as).
    Returns:
        The scheduler; `release()` it (or use it as a context manager).
    """
    handle = await run_steps(conn, _begin(conn.url, name, install, max_queue_readers, execute_as))
    return Scheduler(conn, SchedulerNames(name), handle, max_running)


def install_scheduler_sync(
    conn: SyncSession,
    name: str = "Scheduler",
    *,
    max_queue_readers: int = SCHEDULER_READERS,
    execute_as: str | None = None,
) -> None:
    run_steps_sync(conn, _install(conn.url, name, max_queue_readers, execute_as))


def get_scheduler_sync(
    conn: SyncSession,
    name: str = "Scheduler",
    *,
    max_running: int | None = None,
    install: bool = True,
    max_queue_readers: int = SCHEDULER_READERS,
    execute_as: str | None = None,
) -> SyncScheduler:
    handle = run_steps_sync(conn, _begin(conn.url, name, install, max_queue_readers, execute_as))
    return SyncScheduler(conn, SchedulerNames(name), handle, max_running)


# the blocking twins say what the async functions say (the connections' methods agree)
install_scheduler_sync.__doc__ = install_scheduler.__doc__
get_scheduler_sync.__doc__ = get_scheduler.__doc__


# ---- the activated procedure of the target queue ---------------------------------------


_allowed: set[str] = set()  # task functions the broker allowed this process to run


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def run_tasks(conn: SyncSession, task: Any) -> None:
    """The scheduler's activation procedure (the seed's ActivationAsyncTarget).

    RECEIVE one task at a time (committed at once, so other readers take the next
    task of the same scheduler), run it, log it, answer AsyncDone; return after
    `RECEIVE_WAIT` seconds without a task.
    """
    while True:
        messages = conn.call(calls.receive(task.queue, top=1, timeout=RECEIVE_WAIT))
        if not messages:
            return
        message = messages[0]
        if message.is_end_dialog or message.is_error:
            with contextlib.suppress(ConversationEndedError, NotFoundError):
                conn.call(calls.end_conversation(message.conversation_handle))
        elif message.message_type_name.endswith("/" + _SENT):
            _run_one(conn, message)
        else:
            print(
                f"scheduler reader: ignoring a {message.message_type_name} message", file=sys.stderr
            )


def _run_one(conn: SyncSession, message: Message) -> None:
    request = json.loads(message.message_body)
    log_id = int(request["log_id"])
    done = message.message_type_name[: -len(_SENT)] + _DONE
    conn.call(calls.log_task_start(log_id, message.conversation_handle, done))
    error: str | None = None
    result: Any = None
    try:
        spec = str(request["function"])
        if spec not in _allowed:  # the broker decides what its workers may import
            conn.call(calls.check_procedure(spec))
            _allowed.add(spec)
        value = load_function(spec)(*request.get("args", []), **request.get("kwargs", {}))
        if asyncio.iscoroutine(value):
            value = asyncio.run(value)
        result = _jsonable(value)
    except Exception as exc:  # the task failed (or was refused); the reader goes on
        error = f"{type(exc).__name__}: {exc}"
    conn.call(calls.log_task_end(log_id, error))
    answer = {"log_id": log_id, "ok": error is None, "error": error, "result": result}
    with contextlib.suppress(ConversationEndedError, NotFoundError):
        conn.call(calls.send(message.conversation_handle, done, json.dumps(answer)))
