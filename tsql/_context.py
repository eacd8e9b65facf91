"""What the statement modules and the evaluator ask of the session that runs them.

The interpreter (`Session`) implements it; the conversation statements, the DDL and
the evaluator see only this, so the imports run one way.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from ssb import client

from . import _ast as ast
from ._frame import Frame
from ._output import Output
from ._types import Value


class Context(Protocol):
    output: Output
    rowcount: int
    trancount: int
    doomed: bool
    nocount: bool
    login: str | None

    def connection(self) -> client.Connection:
        """The broker connection (a clear error when the session has none)."""
        ...

    async def broker(self, call: Awaitable[Any]) -> Any:
        """A client call, with the broker's errors as SQL Server's."""
        ...

    async def value(self, expr: ast.Expr, frame: Frame) -> Value: ...

    async def text_value(self, expr: ast.Expr, frame: Frame) -> str | None: ...

    def sync(self, expr: ast.Expr, frame: Frame) -> Value:
        """An expression without subqueries (a RECEIVE's columns), evaluated at once."""
        ...

    def assign(self, frame: Frame, key: str, value: Value, op: str = "=") -> None: ...

    async def subquery(self, node: ast.Expr, frame: Frame) -> Any: ...

    def system_function(self, name: str) -> Value: ...

    def session_function(self, name: str, args: list[Value]) -> Value: ...

    async def catalog_rows(self, source: Any, fetched: dict[str, list[Any]]) -> list[Any]:
        """The rows of a catalog view (a `_query.Source` of kind "view")."""
        ...
