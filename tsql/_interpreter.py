"""The interpreter: one session that runs batches of T-SQL against a broker.

Theory of operation. A batch is parsed and checked whole (nothing runs when it has a
syntax error), then its statements run in order on a frame of variables. Statements
dispatch on their class to one coroutine each; the conversation statements and the
DDL are in _conversation and _ddl, and reach the broker through the client API only.
An error (level 11 or more) ends the batch unless a TRY block catches it; BREAK,
CONTINUE and RETURN travel as exceptions to their loop or frame.

Transactions are the client's: BEGIN TRANSACTION begins one (nested BEGINs only count,
as @@TRANCOUNT does), COMMIT and ROLLBACK end it, and outside one every statement the
broker runs commits on its own. A statement that fails inside a transaction leaves
nothing of itself applied: the broker applies each statement whole or not at all, and
a RECEIVE whose column expressions fail after the broker took the messages makes the
transaction uncommittable (XACT_STATE() = -1: only ROLLBACK is possible), since undoing
one statement inside a transaction needs savepoints the broker does not have yet.
Outside a transaction such a RECEIVE runs in a transaction of its own, so that a
failure puts the messages back.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from ssb import client

from . import _ast as ast
from . import _types as t
from ._compile import Declared, check
from ._errors import INFORMATIONAL, NotSupported, SqlError, from_broker
from ._eval import Evaluator
from ._frame import Frame, Slot, TableVariable
from ._interfaces import (
    Databases,
    NoProcedures,
    ProcedureCatalog,
    SingleDatabase,
    StoredProcedure,
)
from ._output import Output, ResultSet
from ._parser import parse_batch
from ._query import Engine, column_kinds, frame_parameters, queue_columns, queue_table, translate
from ._source import Batch
from ._types import Value

if TYPE_CHECKING:
    pass

MAX_NESTING: Final = 32
_KINDS: Final = column_kinds()


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class _Return(Exception):
    def __init__(self, value: int | None) -> None:
        self.value = value


class Session:
    """A T-SQL session on one broker connection (or none, for what needs no broker).

    Args:
        conn: the async client connection the statements run on.
        output: where result sets, messages and errors go, in order.
        procedures: the stored procedures' catalog (default: none can be created yet).
        databases: the broker's databases (default: one, 'ssb').
    """

    def __init__(
        self,
        conn: client.Connection | None,
        output: Output,
        *,
        procedures: ProcedureCatalog | None = None,
        databases: Databases | None = None,
        login: str | None = None,
    ) -> None:
        self.conn = conn
        self.output = output
        self.procedures: ProcedureCatalog = procedures or NoProcedures()
        self.databases: Databases = databases or SingleDatabase()
        self.login = login
        self.evaluator = Evaluator(self)
        self.engine = Engine()
        self.trancount = 0
        self.transaction_names: list[str | None] = []
        self.doomed = False
        self.rowcount = 0
        self.last_error = 0
        self.caught: list[SqlError] = []
        self.nocount = False
        self.parse_only = False
        self.xact_abort = False
        self.nesting = 0
        self._compiled: dict[str, tuple[ast.CreateProcedure, list[Declared]]] = {}
        from ._conversation import CONVERSATION_STATEMENTS
        from ._ddl import DDL_STATEMENTS

        self._dispatch: dict[type, Callable[[Any, Frame], Awaitable[None]]] = {
            ast.Declare: self._declare,
            ast.SetVariable: self._set_variable,
            ast.SetOption: self._set_option,
            ast.SelectStatement: self._select,
            ast.Block: self._block,
            ast.If: self._if,
            ast.While: self._while,
            ast.Break: self._break,
            ast.Continue: self._continue,
            ast.TryCatch: self._try_catch,
            ast.Transaction: self._transaction,
            ast.Print: self._print,
            ast.RaiseError: self._raiserror,
            ast.Throw: self._throw,
            ast.Return: self._return,
            ast.WaitforDelay: self._waitfor_delay,
            ast.Execute: self._execute,
            ast.CreateProcedure: self._create_procedure,
            ast.DropProcedure: self._drop_procedure,
            ast.Use: self._use,
            ast.Database: self._database,
            ast.Refused: self._refused,
        }
        for kind, handler in {**CONVERSATION_STATEMENTS, **DDL_STATEMENTS}.items():
            self._dispatch[kind] = _bind(handler, self)

    # ---- batches ----------------------------------------------------------------------------

    async def run_batch(self, batch: Batch) -> bool:
        """Parse, check and run one batch (GO n times); False when it ended in an error."""
        try:
            statements = parse_batch(batch.text, batch.first_line)
            declared = check(statements)
        except SqlError as exc:
            self.output.error(exc)
            return False
        was_parse_only = self.parse_only
        for statement in statements:
            if isinstance(statement, ast.SetOption) and statement.option == "PARSEONLY":
                self.parse_only = statement.value == "ON"
        if was_parse_only or self.parse_only:
            return True
        for _ in range(batch.count):
            if not await self.run_statements(statements, declared):
                return False
        return True

    async def run_statements(
        self, statements: list[ast.Statement], declared: list[Declared]
    ) -> bool:
        frame = self.new_frame(declared)
        try:
            await self.block(statements, frame)
        except _Return:
            pass
        except SqlError as exc:
            await self._batch_failed(exc)
            return False
        except (_Break, _Continue):  # refused by the checker; never here
            return False
        return True

    async def _batch_failed(self, exc: SqlError) -> None:
        if self.trancount and (self.xact_abort or exc.level >= 20):
            await self._rollback_all()
        self.output.error(exc)

    def new_frame(self, declared: list[Declared], procedure: str | None = None) -> Frame:
        frame = Frame(procedure=procedure, nesting=self.nesting)
        for item in declared:
            if item.type is None:
                frame.variables[item.key] = Slot(t.NULL.type, t.NULL, TableVariable(item.columns))
            else:
                frame.variables[item.key] = Slot(item.type, Value(None, item.type))
        return frame

    async def block(self, statements: list[ast.Statement], frame: Frame) -> None:
        dispatch = self._dispatch
        for statement in statements:
            try:
                await dispatch[type(statement)](statement, frame)
            except SqlError as exc:
                raise exc.at(statement.line, frame.procedure) from None
            except client.BrokerError as exc:
                raise from_broker(exc).at(statement.line, frame.procedure) from None
            self.last_error = 0

    # ---- broker access --------------------------------------------------------------------

    def connection(self) -> client.Connection:
        if self.conn is None:
            raise SqlError(
                40517, "this statement needs a broker: run it with ssb sql --url ssb://..."
            )
        return self.conn

    async def broker(self, call: Awaitable[Any]) -> Any:
        """A client call, with the broker's errors as SQL Server's."""
        try:
            return await call
        except client.BrokerError as exc:
            raise from_broker(exc) from None

    # ---- values ------------------------------------------------------------------------------

    async def value(self, expr: ast.Expr, frame: Frame) -> Value:
        return await self.evaluator.value(expr, frame)

    def sync(self, expr: ast.Expr, frame: Frame) -> Value:
        return self.evaluator.sync(expr, frame)

    async def text_value(self, expr: ast.Expr, frame: Frame) -> str | None:
        value = await self.value(expr, frame)
        return None if value.data is None else t.to_text(value)

    def assign(self, frame: Frame, key: str, value: Value, op: str = "=") -> None:
        slot = frame.variables[key]
        if slot.table is not None:
            raise SqlError(137, f'Must declare the scalar variable "{key}".', level=15)
        if op != "=":
            current = slot.value
            if op in ("+=", "-=", "*=", "/=", "%=", "&=", "|=", "^="):
                from ._operators import arithmetic

                value = arithmetic(op[0], current, value)
        slot.value = t.assign(value, slot.type)

    def system_function(self, name: str) -> Value:
        if name == "@@ROWCOUNT":
            return Value(self.rowcount, t.INT)
        if name == "@@TRANCOUNT":
            return Value(self.trancount, t.INT)
        if name == "@@ERROR":
            return Value(self.last_error, t.INT)
        if name == "@@NESTLEVEL":
            return Value(self.nesting, t.INT)
        if name in ("@@SERVERNAME", "@@SERVICENAME"):
            return Value(getattr(self.conn, "server", None) or "ssb", t.NVARCHAR)
        if name == "@@VERSION":
            return Value("ssb T-SQL (Service Broker's statements on the ssb broker)", t.NVARCHAR)
        if name == "@@SPID":
            return Value(1, t.SqlType("SMALLINT"))
        if name == "@@DATEFIRST":
            return Value(7, t.SqlType("TINYINT"))
        if name in ("@@IDENTITY",):
            return Value(None, t.DECIMAL)
        raise NotSupported(
            name,
            "ssb's T-SQL has @@ROWCOUNT, @@TRANCOUNT, @@ERROR, @@NESTLEVEL,"
            " @@SERVERNAME, @@VERSION and @@SPID",
        )

    def session_function(self, name: str, args: list[Value]) -> Value:
        error = self.caught[-1] if self.caught else None
        if name.startswith("ERROR_"):
            if error is None:
                return Value(None, t.INT if name != "ERROR_MESSAGE" else t.NVARCHAR)
            found = {
                "ERROR_NUMBER": Value(error.number, t.INT),
                "ERROR_MESSAGE": Value(error.text, t.SqlType("NVARCHAR", 4000)),
                "ERROR_SEVERITY": Value(error.level, t.INT),
                "ERROR_STATE": Value(error.state, t.INT),
                "ERROR_LINE": Value(error.line, t.INT),
                "ERROR_PROCEDURE": Value(error.procedure, t.SYSNAME),
            }.get(name)
            if found is not None:
                return found
        if name == "XACT_STATE":
            return Value(
                0 if not self.trancount else (-1 if self.doomed else 1), t.SqlType("SMALLINT")
            )
        if name == "DB_NAME":
            if args and args[0].data not in (None, 1):
                return Value(None, t.SYSNAME)
            return Value(self.databases.current(), t.SYSNAME)
        if name == "DB_ID":
            if (
                args
                and args[0].data is not None
                and t.to_text(args[0]).lower() != self.databases.current().lower()
            ):
                return Value(None, t.INT)
            return Value(1, t.INT)
        if name in (
            "SUSER_SNAME",
            "SUSER_NAME",
            "USER_NAME",
            "CURRENT_USER",
            "SESSION_USER",
            "SYSTEM_USER",
            "USER",
            "ORIGINAL_LOGIN",
        ):
            return Value(self.login, t.SYSNAME)
        if name in ("SCHEMA_NAME",):
            return Value("dbo", t.SYSNAME)
        if name == "HOST_NAME":
            return Value(None, t.SYSNAME)
        if name == "APP_NAME":
            return Value("ssb sql", t.SYSNAME)
        if name == "FORMATMESSAGE" and args:
            return Value(format_message(t.to_text(args[0]), args[1:]), t.SqlType("NVARCHAR", 2047))
        if name == "OBJECT_ID":
            raise NotSupported(
                "OBJECT_ID()",
                "look the object up in the catalog views: IF EXISTS (SELECT * FROM"
                " sys.service_queues WHERE name = N'...')",
            )
        raise SqlError(195, f"'{name}' is not a recognized built-in function name.")

    # ---- queries --------------------------------------------------------------------------------

    async def query(self, select: ast.Select, frame: Frame) -> ResultSet:
        """A SELECT that reads views, queues or table variables, on the SQL engine."""
        if select.sql is None:
            select.sql = translate(select)
        translation = select.sql
        fetched: dict[str, list[Any]] = {}
        for source in translation.sources:
            if source.kind == "view":
                from ._catalog import SYS_VIEWS

                view = SYS_VIEWS[source.name]
                for name in view.sources:
                    if name not in fetched:
                        fetched[name] = await self.broker(self.connection().view(name))
                if source.name == "sys.databases":
                    fetched["__databases__"] = [
                        (
                            d.name,
                            d.database_id,
                            d.is_broker_enabled,
                            d.service_broker_guid,
                            d.is_trustworthy_on,
                        )
                        for d in await self.databases.list()
                    ]
                if source.name in ("sys.objects", "sys.procedures"):
                    fetched["__procedures__"] = list(await self.procedures.names())
                self.engine.load(
                    source, view.columns, view.build(fetched, self.databases.current())
                )
            elif source.kind == "queue":
                rows = await self._peek(source.name)
                self.engine.load(source, queue_columns(), queue_table(rows))
            else:
                slot = frame.variables.get(source.name)
                if slot is None or slot.table is None:
                    raise SqlError(1087, f'Must declare the table variable "{source.name}".')
                self.engine.load(
                    source, slot.table.columns, [[v.data for v in row] for row in slot.table.rows]
                )
        return self.engine.run(translation, frame_parameters(translation, frame), _KINDS)

    async def _peek(self, name: str) -> list[dict[str, Any]]:
        try:
            rows: list[dict[str, Any]] = await self.connection().view(f"queue:{name}")
        except client.NotFoundError:
            raise SqlError(208, f"Invalid object name '{name}'.") from None
        except client.BrokerError as exc:
            raise from_broker(exc) from None
        return rows

    async def subquery(self, node: ast.Expr, frame: Frame) -> Any:
        """The answer of a subquery: EXISTS -> bool, scalar -> Value, IN -> values."""
        assert isinstance(node, (ast.Exists, ast.Subquery, ast.InQuery))
        select = node.query
        if not select.has_from:
            values = [await self.value(item.expr, frame) for item in select.items]
            rows = [values]
        else:
            rows = (await self.query(select, frame)).rows
        if isinstance(node, ast.Exists):
            return bool(rows)
        if isinstance(node, ast.InQuery):
            return [row[0] for row in rows]
        if len(rows) > 1:
            raise SqlError(
                512,
                "Subquery returned more than 1 value. This is not permitted when the subquery"
                " follows =, !=, <, <= , >, >= or when the subquery is used as an expression.",
            )
        return rows[0][0] if rows else t.NULL

    # ---- procedural statements ---------------------------------------------------------------

    async def _declare(self, statement: ast.Declare, frame: Frame) -> None:
        for item in statement.items:
            if item.init is not None:
                self.assign(frame, item.key, await self.value(item.init, frame))
            elif item.type is None:
                slot = frame.variables[item.key]
                assert slot.table is not None
                slot.table.rows.clear()

    async def _set_variable(self, statement: ast.SetVariable, frame: Frame) -> None:
        self.assign(frame, statement.key, await self.value(statement.expr, frame), statement.op)
        self.rowcount = 1

    async def _set_option(self, statement: ast.SetOption, frame: Frame) -> None:
        option, value = statement.option, statement.value
        if option == "NOCOUNT":
            self.nocount = value == "ON"
        elif option == "PARSEONLY":
            self.parse_only = value == "ON"
        elif option == "XACT_ABORT":
            self.xact_abort = value == "ON"
        elif option in _SQL_SERVER_DEFAULTS and value == "ON":
            pass  # ssb always behaves as these options ON say
        elif option == "TRANSACTION ISOLATION LEVEL" and value == "READ COMMITTED":
            pass  # what ssb's transactions give
        else:
            raise NotSupported(
                f"SET {option} {value}",
                "ssb's T-SQL knows SET NOCOUNT, XACT_ABORT, PARSEONLY, and ANSI_NULLS,"
                " QUOTED_IDENTIFIER, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL ON",
            )
        self.rowcount = 0

    async def _select(self, statement: ast.SelectStatement, frame: Frame) -> None:
        select = statement.query
        if select.into is not None:
            raise NotSupported("SELECT ... INTO", "tables come with a later version of ssb")
        if select.has_from:
            result = await self.query(select, frame)
            if select.assigns:
                for row in result.rows:
                    for item, value in zip(select.items, row, strict=True):
                        assert item.target is not None
                        self.assign(frame, item.target, value, item.op)
            else:
                self.output.result(result, self.nocount)
            self.rowcount = len(result.rows)
            return
        if select.top is not None:
            top = (await self.value(select.top, frame)).data
            if top is not None and int(top) <= 0:  # type: ignore[call-overload]
                self.rowcount = 0
                return
        values = [await self.value(item.expr, frame) for item in select.items]
        if select.assigns:
            if not all(item.target for item in select.items):
                raise SqlError(
                    141,
                    "A SELECT statement that assigns a value to a variable must not be combined"
                    " with data-retrieval operations.",
                )
            for item, value in zip(select.items, values, strict=True):
                assert item.target is not None
                self.assign(frame, item.target, value, item.op)
        else:
            columns = [_column_name(item) for item in select.items]
            self.output.result(ResultSet(columns, [v.type for v in values], [values]), self.nocount)
        self.rowcount = 1

    async def _block(self, statement: ast.Block, frame: Frame) -> None:
        await self.block(statement.body, frame)

    async def _if(self, statement: ast.If, frame: Frame) -> None:
        if await self.evaluator.condition(statement.condition, frame):
            await self.block([statement.then], frame)
        elif statement.otherwise is not None:
            await self.block([statement.otherwise], frame)

    async def _while(self, statement: ast.While, frame: Frame) -> None:
        condition = statement.condition
        body = [statement.body]
        evaluator = self.evaluator
        while await evaluator.condition(condition, frame):
            try:
                await self.block(body, frame)
            except _Break:
                return
            except _Continue:
                continue

    async def _break(self, statement: ast.Break, frame: Frame) -> None:
        raise _Break

    async def _continue(self, statement: ast.Continue, frame: Frame) -> None:
        raise _Continue

    async def _try_catch(self, statement: ast.TryCatch, frame: Frame) -> None:
        try:
            await self.block(statement.body, frame)
        except SqlError as exc:
            if exc.level <= INFORMATIONAL or exc.level >= 20:
                raise
            if self.trancount and self.xact_abort:
                self.doomed = True
            self.caught.append(exc)
            self.last_error = exc.number
            try:
                await self.block(statement.handler, frame)
            finally:
                self.caught.pop()

    async def _transaction(self, statement: ast.Transaction, frame: Frame) -> None:
        action = statement.action
        self.rowcount = 0
        if action == "BEGIN":
            if self.trancount == 0:
                await self.broker(self.connection().begin_transaction())
                self.doomed = False
            self.trancount += 1
            self.transaction_names.append(statement.name)
            return
        if action == "SAVE":
            raise NotSupported(
                "SAVE TRANSACTION",
                "rolling back to a savepoint needs savepoints in the broker, which come in"
                " the next version; commit or roll back the whole transaction",
                yet=True,
            )
        if action == "COMMIT":
            if self.trancount == 0:
                raise SqlError(
                    3902, "The COMMIT TRANSACTION request has no corresponding BEGIN TRANSACTION."
                )
            if self.doomed:
                raise SqlError(
                    3930,
                    "The current transaction cannot be committed and cannot support operations"
                    " that write to the log file. Roll back the transaction.",
                )
            if self.trancount == 1:
                self.trancount = 0
                self.transaction_names.clear()
                await self.broker(self.connection().commit())
            else:
                self.trancount -= 1
                self.transaction_names.pop()
            return
        # ROLLBACK
        if self.trancount == 0:
            raise SqlError(
                3903, "The ROLLBACK TRANSACTION request has no corresponding BEGIN TRANSACTION."
            )
        name = statement.name
        if name is not None and self.transaction_names and name != self.transaction_names[0]:
            if name.startswith("@"):
                slot = frame.variables.get(name)
                named = None if slot is None or slot.value.data is None else t.to_text(slot.value)
                if named == self.transaction_names[0]:
                    await self._rollback_all()
                    return
            raise SqlError(
                6401,
                f"Cannot roll back {name}. No transaction or savepoint of that name was found.",
            )
        await self._rollback_all()

    async def _rollback_all(self) -> None:
        self.trancount = 0
        self.transaction_names.clear()
        self.doomed = False
        await self.broker(self.connection().rollback())

    async def _print(self, statement: ast.Print, frame: Frame) -> None:
        value = await self.value(statement.expr, frame)
        self.output.message("" if value.data is None else t.to_text(value))
        self.rowcount = 0

    async def _raiserror(self, statement: ast.RaiseError, frame: Frame) -> None:
        message = await self.value(statement.message, frame)
        severity = _small_int(await self.value(statement.severity, frame))
        state = _small_int(await self.value(statement.state, frame))
        args = [await self.value(a, frame) for a in statement.args]
        if message.type.family == "int":
            number = int(message.data or 0)  # type: ignore[call-overload]
            text = (
                f"Error {number}, severity {severity}, state {state} was raised, but no message"
                " with that error number was found in sys.messages. If error is larger than"
                " 50000, make sure the user-defined message is added using sp_addmessage."
            )
            number = 18054
            severity = max(severity, 16)
        else:
            number = 50000
            text = format_message("" if message.data is None else t.to_text(message), args)
        self.rowcount = 0
        if severity <= INFORMATIONAL:
            self.output.message(text)
            return
        raise SqlError(number, text, level=min(severity, 25), state=state)

    async def _throw(self, statement: ast.Throw, frame: Frame) -> None:
        if statement.number is None:
            if not self.caught:
                raise SqlError(
                    10704,
                    "To rethrow an error, a THROW statement must be used inside a CATCH block."
                    " Insert the THROW statement inside a CATCH block, or add error parameters"
                    " to the THROW statement.",
                )
            caught = self.caught[-1]
            raise SqlError(
                caught.number,
                caught.text,
                level=caught.level,
                state=caught.state,
                line=caught.line,
                procedure=caught.procedure,
            )
        number = (await self.value(statement.number, frame)).data
        assert statement.message is not None and statement.state is not None
        text = await self.text_value(statement.message, frame)
        state = _small_int(await self.value(statement.state, frame))
        if not isinstance(number, int) or number < 50000:
            raise SqlError(
                35100,
                f"Error number {number} in the THROW statement is outside the valid range."
                " Specify an error number in the valid range of 50000 to 2147483647.",
            )
        raise SqlError(number, text or "", level=16, state=state)

    async def _return(self, statement: ast.Return, frame: Frame) -> None:
        if statement.expr is None:
            raise _Return(None)
        if frame.procedure is None:
            raise SqlError(
                178, "A RETURN statement with a return value cannot be used in this context."
            )
        value = await self.value(statement.expr, frame)
        raise _Return(None if value.data is None else int(t.convert(value, t.INT).data))  # type: ignore[call-overload]

    async def _waitfor_delay(self, statement: ast.WaitforDelay, frame: Frame) -> None:
        text = await self.text_value(statement.delay, frame)
        match = re.fullmatch(
            r"\s*(\d{1,2}):(\d{1,2})(?::(\d{1,2})(?:\.(\d{1,3}))?)?\s*", text or ""
        )
        if match is None:
            raise SqlError(148, f"Incorrect time syntax in time string '{text}' used with WAITFOR.")
        hours, minutes, seconds = int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)
        millis = int((match.group(4) or "0").ljust(3, "0"))
        span = hours * 3600 + minutes * 60 + seconds + millis / 1000
        if statement.until:
            now = dt.datetime.now()
            target = now.replace(
                hour=hours % 24, minute=minutes, second=seconds, microsecond=millis * 1000
            )
            if target <= now:
                target += dt.timedelta(days=1)
            span = (target - now).total_seconds()
        await asyncio.sleep(span)

    async def _use(self, statement: ast.Use, frame: Frame) -> None:
        await self.databases.use(statement.database)
        self.rowcount = 0

    async def _database(self, statement: ast.Database, frame: Frame) -> None:
        if statement.action == "CREATE":
            await self.databases.create(statement.name)
        elif statement.action == "DROP":
            await self.databases.drop(statement.name)
        else:
            await self.databases.alter(statement.name, statement.options)

    async def _refused(self, statement: ast.Refused, frame: Frame) -> None:
        raise NotSupported(statement.what, statement.instead)

    # ---- procedures ------------------------------------------------------------------------------

    async def _create_procedure(self, statement: ast.CreateProcedure, frame: Frame) -> None:
        check(statement.body, statement.parameters)
        await self.procedures.create(
            StoredProcedure(statement.name, statement.text, self.login or ""),
            replace=statement.alter or statement.or_alter,
        )

    async def _drop_procedure(self, statement: ast.DropProcedure, frame: Frame) -> None:
        for name in statement.names:
            if not await self.procedures.drop(name) and not statement.if_exists:
                raise SqlError(
                    3701,
                    f"Cannot drop the procedure '{name}', because it does not exist or you do not"
                    " have permission.",
                )

    async def _compile(self, name: str) -> tuple[ast.CreateProcedure, list[Declared]]:
        found = await self.procedures.get(name)
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

    async def _execute(self, statement: ast.Execute, frame: Frame) -> None:
        definition, declared = await self._compile(statement.procedure)
        if self.nesting >= MAX_NESTING:
            raise SqlError(
                217,
                "Maximum stored procedure, function, trigger, or view nesting level exceeded"
                f" (limit {MAX_NESTING}).",
            )
        callee = Frame(procedure=definition.name, nesting=self.nesting + 1)
        outputs = await self._bind(definition, statement.arguments, frame, callee)
        for item in declared:
            if item.type is None:
                callee.variables[item.key] = Slot(t.NULL.type, t.NULL, TableVariable(item.columns))
            else:
                callee.variables[item.key] = Slot(item.type, Value(None, item.type))
        trancount = self.trancount
        self.nesting += 1
        status = 0
        try:
            await self.block(definition.body, callee)
        except _Return as returned:
            status = returned.value or 0
        finally:
            self.nesting -= 1
        for target, parameter in outputs:
            self.assign(frame, target, callee.variables[parameter].value)
        if statement.result is not None:
            self.assign(frame, statement.result, Value(status, t.INT))
        if self.trancount != trancount:
            raise SqlError(
                266,
                "Transaction count after EXECUTE indicates a mismatching number of BEGIN and"
                f" COMMIT statements. Previous count = {trancount}, current count ="
                f" {self.trancount}.",
                procedure=definition.name,
            )

    async def _bind(
        self,
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
                        "Must pass parameter number 2 and subsequent parameters as '@name ="
                        " value'. After the form '@name = value' has been used, all subsequent"
                        " parameters must be passed in the form '@name = value'.",
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
                        8145, f"{argument.name} is not a parameter for procedure {definition.name}."
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
                    await self.value(parameter.default, callee)
                    if parameter.default is not None
                    else Value(None, parameter.type)
                )
            else:
                value = await self.value(argument.expr, frame)
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


_SQL_SERVER_DEFAULTS: Final = frozenset(
    (
        "ANSI_NULLS",
        "QUOTED_IDENTIFIER",
        "ANSI_WARNINGS",
        "ARITHABORT",
        "CONCAT_NULL_YIELDS_NULL",
        "ANSI_PADDING",
        "ANSI_NULL_DFLT_ON",
    )
)


def _bind(
    handler: Callable[..., Awaitable[None]], session: Session
) -> Callable[[Any, Frame], Awaitable[None]]:
    async def run(statement: Any, frame: Frame) -> None:
        await handler(session, statement, frame)

    return run


def _small_int(value: Value) -> int:
    if value.data is None:
        return 0
    return t.as_int(value)


def _column_name(item: ast.SelectItem) -> str:
    if item.alias is not None:
        return item.alias
    if isinstance(item.expr, ast.Column):
        return item.expr.name
    return ""


_FORMAT: Final = re.compile(r"%([-+ 0#]*)(\d+|\*)?(?:\.(\d+|\*))?(?:h|l|I64)?([disuoxXc%])")


def format_message(template: str, args: list[Value]) -> str:
    """RAISERROR's and FORMATMESSAGE's printf-style substitution."""
    remaining = list(args)

    def substitute(m: re.Match[str]) -> str:
        flags, width, precision, kind = m.group(1), m.group(2), m.group(3), m.group(4)
        if kind == "%":
            return "%"
        if width == "*":
            width = str(_small_int(remaining.pop(0))) if remaining else ""
        if precision == "*":
            precision = str(_small_int(remaining.pop(0))) if remaining else ""
        if not remaining:
            return "(null)"
        value = remaining.pop(0)
        if value.data is None:
            return "(null)"
        spec = f"%{flags}{width or ''}" + (f".{precision}" if precision else "")
        if kind in "diuoxX":
            number = t.as_int(value)
            return (spec + ("d" if kind in "iu" else kind)) % number
        text = t.to_text(value)
        return (spec + "s") % text

    return _FORMAT.sub(substitute, template)
