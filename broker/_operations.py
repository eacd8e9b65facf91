"""The operations a client may call: one table, merged from what each part offers.

Each part of the daemon (the core, views, the transport, activation, the scheduler's
execution log) hands the daemon a dict of its operations; `merge` adds them and fails
start-up on a name offered twice, so no part can silently replace another's operation.
A part may offer operations as observations (views, ping): they change nothing, so
the server may answer them while the store cannot write (see `_server`).
A call checks the request's argument names against the operation's parameters first
(sets taken from its signature once, at merge), so a wrong argument is a clear error
rather than a traceback; then the names it gives are qualified with the session's
database (`Scope`, see `_namespaces`).

A request outside a transaction may carry `txn`, the id its client gave the statement:
`Statements` (the core's transactions) refuses an id already resolved and records the id
of a statement that succeeded, in the same synchronous stretch as its effects, so that a
client that lost the answer can ask whether it was applied (see `_core.outcomes`).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ssb.protocol import ErrorCode, Request

from ._errors import BrokerError

Operation = Callable[..., Any]


def methods(part: object, *names: str) -> dict[str, Operation]:
    """Operations that are `part`'s methods of the same names."""
    return {name: getattr(part, name) for name in names}


class Guard(Protocol):
    """Who may call what (see `_permissions`)."""

    def check(self, session: Any, operation: str, arguments: dict[str, Any]) -> None: ...

    def succeeded(self, session: Any, operation: str, arguments: dict[str, Any]) -> None: ...

    # the operations whose success `succeeded` must hear of
    tracked: frozenset[str]


class Scope(Protocol):
    """Which database a session's names are in (see `_namespaces`)."""

    def qualify(self, session: Any, operation: str, arguments: dict[str, Any]) -> None: ...

    def shown(self, session: Any, message: str) -> str: ...


class Statements(Protocol):
    """Named statements outside a transaction (see `_core.transactions`)."""

    def begin_statement(self, session: Any, txn: object) -> Any: ...

    def end_statement(self, session: Any, name: Any, done: bool) -> None: ...


@dataclass(frozen=True, slots=True)
class _Parameters:
    """The argument names an operation takes after its session (None: any)."""

    accepted: frozenset[str] | None
    required: frozenset[str]

    @classmethod
    def of(cls, fn: Operation) -> _Parameters:
        kind = inspect.Parameter
        params = list(inspect.signature(fn).parameters.values())[1:]  # after the session
        named = [p for p in params if p.kind in (kind.POSITIONAL_OR_KEYWORD, kind.KEYWORD_ONLY)]
        takes_any = any(p.kind is kind.VAR_KEYWORD for p in params)
        accepted = None if takes_any else frozenset(p.name for p in named)
        variadic = (kind.VAR_POSITIONAL, kind.VAR_KEYWORD)
        required = frozenset(
            p.name for p in params if p.default is p.empty and p.kind not in variadic
        )
        return cls(accepted, required)

    def problem(self, arguments: Mapping[str, Any]) -> str | None:
        """What is wrong with `arguments` (None: nothing)."""
        keys = arguments.keys()
        if self.accepted is not None and not keys <= self.accepted:
            unexpected = ", ".join(map(repr, sorted(keys - self.accepted)))
            takes = ", ".join(sorted(self.accepted)) or "no arguments"
            return f"does not take {unexpected} (it takes: {takes})"
        if not self.required <= keys:
            return f"needs {', '.join(map(repr, sorted(self.required - keys)))}"
        return None


class Operations:
    def __init__(
        self,
        guard: Guard | None = None,
        statements: Statements | None = None,
        scope: Scope | None = None,
    ) -> None:
        self._table: dict[str, tuple[Operation, _Parameters, str]] = {}
        self._observations: set[str] = set()
        self.guard = guard
        self.statements = statements
        self.scope = scope

    def merge(
        self, owner: str, operations: Mapping[str, Operation], *, observing: bool = False
    ) -> None:
        for name, fn in operations.items():
            known = self._table.get(name)
            if known is not None:
                raise RuntimeError(f"operation '{name}' is offered by both {known[2]} and {owner}")
            self._table[name] = (fn, _Parameters.of(fn), owner)
            if observing:
                self._observations.add(name)

    def observes(self, name: str) -> bool:
        """Whether `name` only looks (changes nothing)."""
        return name in self._observations

    def names(self) -> list[str]:
        return sorted(self._table)

    def shown(self, session: Any, message: str) -> str:
        """An error's words as `session` sees them (names in its database's terms)."""
        return message if self.scope is None else self.scope.shown(session, message)

    def call(self, session: Any, request: Request) -> Any:
        statements = self.statements
        if statements is None or "txn" not in request.arguments:
            return self._call(session, request)
        name = statements.begin_statement(session, request.arguments.pop("txn"))
        try:
            result = self._call(session, request)
        except BaseException:
            statements.end_statement(session, name, False)
            raise
        if inspect.isawaitable(result):
            return self._named(result, statements, session, name)
        statements.end_statement(session, name, True)
        return result

    @staticmethod
    async def _named(
        pending: Awaitable[Any], statements: Statements, session: Any, name: Any
    ) -> Any:
        done = False
        try:
            result = await pending
            done = True
            return result
        finally:
            statements.end_statement(session, name, done)

    def _call(self, session: Any, request: Request) -> Any:
        entry = self._table.get(request.operation)
        if entry is None:
            raise BrokerError(
                ErrorCode.UNKNOWN_OPERATION,
                f"unknown operation '{request.operation}'; is the client newer than the broker?",
            )
        fn, parameters, _ = entry
        problem = parameters.problem(request.arguments)
        if problem is not None:
            raise BrokerError(ErrorCode.BAD_ARGUMENT, f"{request.operation}: {problem}")
        if self.scope is not None:
            self.scope.qualify(session, request.operation, request.arguments)
        guard = self.guard
        if guard is None:
            return fn(session, **request.arguments)
        operation = request.operation
        guard.check(session, operation, request.arguments)
        result = fn(session, **request.arguments)
        if operation not in guard.tracked:
            return result
        if inspect.isawaitable(result):
            return self._then(result, guard, session, request)
        guard.succeeded(session, request.operation, request.arguments)
        return result

    @staticmethod
    async def _then(pending: Awaitable[Any], guard: Guard, session: Any, request: Request) -> Any:
        result = await pending
        guard.succeeded(session, request.operation, request.arguments)
        return result
