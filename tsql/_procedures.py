"""Stored procedures, the interpreter's side: CREATE / ALTER / DROP PROCEDURE and
EXECUTE with positional and named arguments, defaults, OUTPUT parameters, RETURN
values and nesting, on whatever catalog keeps the procedures (`ProcedureCatalog`).

Theory of operation. The catalog keeps a procedure's CREATE text; the first EXECUTE
parses and checks it and keeps the result by text, so a loop that calls a procedure
parses it once. A call runs the body on a frame of its own (its parameters and its
DECLAREs), copies OUTPUT parameters back to the caller's variables, and checks that
the procedure left @@TRANCOUNT as it found it (Msg 266), as SQL Server does.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Final, Protocol

from . import _ast as ast
from . import _types as t
from ._compile import Declared, check
from ._errors import SqlError
from ._frame import Frame, Return, Slot, TableVariable
from ._interfaces import ProcedureCatalog, StoredProcedure
from ._output import Output
from ._parser import parse_batch
from ._types import Value

MAX_NESTING: Final = 32


class Host(Protocol):
    """What a procedure call needs of the session that makes it."""

    login: str | None
    nesting: int
    trancount: int
    output: Output
    nocount: bool
    xact_abort: bool

    def block(self, statements: list[ast.Statement], frame: Frame) -> Awaitable[None]: ...

    async def value(self, expr: ast.Expr, frame: Frame) -> Value: ...

    def assign(self, frame: Frame, key: str, value: Value, op: str = "=") -> None: ...

    def drop_temporary(self, frame: Frame) -> Awaitable[None]:
        """Drop the temporary tables a procedure call made (`frame.temporary`)."""
        ...


def new_frame(declared: list[Declared], procedure: str | None = None, nesting: int = 0) -> Frame:
    """A frame holding every variable a batch or procedure declares, NULL to start."""
    frame = Frame(procedure=procedure, nesting=nesting)
    declare(frame, declared)
    return frame


def declare(frame: Frame, declared: list[Declared]) -> None:
    for item in declared:
        if item.type is None:
            table = TableVariable(item.columns, constraints=item.constraints, name=item.name)
            frame.variables[item.key] = Slot(t.NULL.type, t.NULL, table)
        else:
            frame.variables[item.key] = Slot(item.type, Value(None, item.type))


class Procedures:
    """CREATE, DROP and EXECUTE of T-SQL procedures kept in `catalog`."""

    def __init__(self, catalog: ProcedureCatalog) -> None:
        self.catalog = catalog
        self._compiled: dict[str, tuple[ast.CreateProcedure, list[Declared]]] = {}

    async def create(self, host: Host, statement: ast.CreateProcedure, frame: Frame) -> None:
        check(statement.body, statement.parameters)
        if statement.alter and await self.catalog.get(statement.name) is None:
            raise SqlError(208, f"Invalid object name '{statement.name}'.")
        await self.catalog.create(
            StoredProcedure(statement.name, statement.text, host.login or ""),
            replace=statement.alter or statement.or_alter,
        )
        if statement.execute_as not in (None, "CALLER"):
            host.output.message(
                f"ssb runs procedure {statement.name} with the permissions of the login that"
                f" executes it (ssb has no database users): WITH EXECUTE AS"
                f" {statement.execute_as} does what EXECUTE AS CALLER does."
            )

    async def drop(self, host: Host, statement: ast.DropProcedure, frame: Frame) -> None:
        for name in statement.names:
            if not await self.catalog.drop(name) and not statement.if_exists:
                raise SqlError(
                    3701,
                    f"Cannot drop the procedure '{name}', because it does not exist or you do not"
                    " have permission.",
                )

    async def _compile(self, name: str) -> tuple[ast.CreateProcedure, list[Declared]]:
        found = await self.catalog.get(name)
        if found is None:
            raise SqlError(2812, f"Could not find stored procedure '{name}'.")
        cached = self._compiled.get(found.text)
        if cached is None:
            statements = parse_batch(found.text, 1)
            definition = statements[0]
            if len(statements) != 1 or not isinstance(definition, ast.CreateProcedure):
                raise SqlError(2812, f"'{name}' is not a T-SQL procedure.")
            cached = (definition, check(definition.body, definition.parameters))
            self._compiled[found.text] = cached
        return cached

    async def execute(self, host: Host, statement: ast.Execute, frame: Frame) -> None:
        definition, declared = await self._compile(statement.procedure)
        if host.nesting >= MAX_NESTING:
            raise SqlError(
                217,
                "Maximum stored procedure, function, trigger, or view nesting level exceeded"
                f" (limit {MAX_NESTING}).",
            )
        callee = Frame(procedure=definition.name, nesting=host.nesting + 1)
        outputs = await self._bind(host, definition, statement.arguments, frame, callee)
        declare(callee, declared)
        trancount = host.trancount
        options = host.nocount, host.xact_abort  # a procedure's SET lasts until it returns
        host.nesting += 1
        status = 0
        try:
            await host.block(definition.body, callee)
        except Return as returned:
            status = returned.value or 0
        finally:
            host.nesting -= 1
            host.nocount, host.xact_abort = options
            if callee.temporary:
                await host.drop_temporary(callee)
        for target, parameter in outputs:
            host.assign(frame, target, callee.variables[parameter].value)
        if statement.result is not None:
            host.assign(frame, statement.result, Value(status, t.INT))
        if host.trancount != trancount:
            raise SqlError(
                266,
                "Transaction count after EXECUTE indicates a mismatching number of BEGIN and"
                f" COMMIT statements. Previous count = {trancount}, current count ="
                f" {host.trancount}.",
                procedure=definition.name,
            )

    async def _bind(
        self,
        host: Host,
        definition: ast.CreateProcedure,
        arguments: list[ast.Argument],
        frame: Frame,
        callee: Frame,
    ) -> list[tuple[str, str]]:
        parameters = {p.key: p for p in definition.parameters}
        given: dict[str, ast.Argument] = {}
        named = False
        argument: ast.Argument | None
        for index, argument in enumerate(arguments):
            if argument.name is None:
                if named:
                    raise SqlError(
                        119,
                        f"Must pass parameter number {index + 1} and subsequent parameters as"
                        " '@name = value'. After the form '@name = value' has been used, all"
                        " subsequent parameters must be passed in the form '@name = value'.",
                    )
                if index >= len(definition.parameters):
                    raise SqlError(
                        8144,
                        f"Procedure or function {definition.name} has too many arguments specified.",
                    )
                given[definition.parameters[index].key] = argument
            else:
                named = True
                if argument.name not in parameters:
                    raise SqlError(
                        8145,
                        f"{argument.written} is not a parameter for procedure {definition.name}.",
                    )
                given[argument.name] = argument
        outputs: list[tuple[str, str]] = []
        for parameter in definition.parameters:
            argument = given.get(parameter.key)
            if argument is None or argument.expr is None:
                if parameter.default is None and argument is None:
                    raise SqlError(
                        201,
                        f"Procedure or function '{definition.name}' expects parameter"
                        f" '{parameter.name}', which was not supplied.",
                    )
                value = (
                    await host.value(parameter.default, callee)
                    if parameter.default is not None
                    else Value(None, parameter.type)
                )
            else:
                value = await host.value(argument.expr, frame)
                if argument.output:
                    if not parameter.output:
                        raise SqlError(
                            8162,
                            f'The formal parameter "{parameter.name}" was not declared as an'
                            " OUTPUT parameter, but the actual parameter passed in requested"
                            " output.",
                        )
                    if isinstance(argument.expr, ast.Variable):
                        outputs.append((argument.expr.key, parameter.key))
            callee.variables[parameter.key] = Slot(parameter.type, t.assign(value, parameter.type))
        return outputs
