"""The operations a client may call: one table, merged from what each part offers.

Each part of the daemon (the core, views, the transport, activation, the scheduler's
execution log) hands the daemon a dict of its operations; `merge` adds them and fails
start-up on a name offered twice, so no part can silently replace another's operation.
A part may offer operations as observations (views, ping): they change nothing, so
the server may answer them while the store cannot write (see `_server`).
A call checks the request's arguments against the operation's signature first, so a
wrong argument is a clear error rather than a traceback.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ssb.protocol import ErrorCode, Request

from ._errors import BrokerError

Operation = Callable[..., Any]


class Operations:
    def __init__(self) -> None:
        self._table: dict[str, tuple[Operation, inspect.Signature, str]] = {}
        self._observations: set[str] = set()

    def merge(
        self, owner: str, operations: Mapping[str, Operation], *, observing: bool = False
    ) -> None:
        for name, fn in operations.items():
            known = self._table.get(name)
            if known is not None:
                raise RuntimeError(
                    f"operation '{name}' is offered by both {known[2]} and {owner}"
                )
            self._table[name] = (fn, inspect.signature(fn), owner)
            if observing:
                self._observations.add(name)

    def observes(self, name: str) -> bool:
        """Whether `name` only looks (changes nothing)."""
        return name in self._observations

    def names(self) -> list[str]:
        return sorted(self._table)

    def call(self, session: Any, request: Request) -> Any:
        entry = self._table.get(request.operation)
        if entry is None:
            raise BrokerError(
                ErrorCode.UNKNOWN_OPERATION,
                f"unknown operation '{request.operation}'; is the client newer than the broker?",
            )
        fn, signature, _ = entry
        try:
            signature.bind(session, **request.arguments)
        except TypeError as exc:
            raise BrokerError(ErrorCode.BAD_ARGUMENT, f"{request.operation}: {exc}") from None
        return fn(session, **request.arguments)
