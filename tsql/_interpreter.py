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
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from ssb import client

from . import _ast as ast
from . import _types as t
from ._broker import BrokerDatabases, BrokerProcedures
from ._catalog import SYS_VIEWS, object_id
from ._compile import Declared, check
from ._errors import (
    INFORMATIONAL,
    NotSupported,
    SqlError,
    assignment_with_retrieval,
    found,
    from_broker,
)
from ._eval import Evaluator, xml_rows
from ._frame import Break, Continue, Frame, Return
from ._interfaces import (
    Databases,
    NoProcedures,
    ProcedureCatalog,
    SingleDatabase,
)
from ._output import Output, ResultSet
from ._parser import SQL_SERVER_DEFAULTS, parse_batch
from ._procedures import Procedures, new_frame
from ._query import (
    Engine,
    Schema,
    Source,
    Translation,
    column_kinds,
    frame_parameters,
    from_sqlite,
    queue_columns,
    queue_table,
    translate,
    translate_text,
)
from ._session_functions import format_message, session_function, small_int, system_function
from ._source import Batch
from ._tables import drop_temporary, joined_query, select_into, table_query
from ._transactions import rollback_all
from ._types import Value

if TYPE_CHECKING:
    pass

_KINDS: Final = column_kinds()
# the broker's views of a database's objects: a query sees the current database's
_PER_DATABASE: Final = frozenset(
    {
        "service_queues",
        "services",
        "service_contracts",
        "message_types",
        "conversation_endpoints",
        "conversation_groups",
        "transmission_queue",
        "conversation_priorities",
        "event_notifications",
        "procedures",
    }
)


class Session:
    """A T-SQL session on one broker connection (or none, for what needs no broker).

    Args:
        conn: the async client connection the statements run on.
        output: where result sets, messages and errors go, in order.
        procedures: the stored procedures' catalog (default: the broker's, or none without
            a broker).
        databases: the databases (default: the broker's, or one, 'master', without a
            broker).
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
        if procedures is None:
            procedures = NoProcedures() if conn is None else BrokerProcedures(conn)
        if databases is None:
            databases = SingleDatabase() if conn is None else BrokerDatabases(conn)
        self.procedures: ProcedureCatalog = procedures
        self.databases: Databases = databases
        self.login = login
        self.evaluator = Evaluator(self)
        self.engine = Engine(self.session_function)
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
        self.stored = Procedures(self.procedures)
        self.tables: set[str] = set()  # names a SELECT found to be the broker's tables
        from ._conversation import CONVERSATION_STATEMENTS
        from ._ddl import DDL_STATEMENTS
        from ._tables import TABLE_STATEMENTS
        from ._transactions import TRANSACTION_STATEMENTS

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
            ast.Print: self._print,
            ast.RaiseError: self._raiserror,
            ast.Throw: self._throw,
            ast.Return: self._return,
            ast.WaitforDelay: self._waitfor_delay,
            ast.Execute: lambda s, f: self.stored.execute(self, s, f),
            ast.CreateProcedure: lambda s, f: self.stored.create(self, s, f),
            ast.DropProcedure: lambda s, f: self.stored.drop(self, s, f),
            ast.Use: self._use,
            ast.Database: self._database,
            ast.Refused: self._refused,
            ast.TableChange: self._table_change,
        }
        statements = {
            **CONVERSATION_STATEMENTS,
            **DDL_STATEMENTS,
            **TRANSACTION_STATEMENTS,
            **TABLE_STATEMENTS,
        }
        for kind, handler in statements.items():
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
        except Return:
            pass
        except SqlError as exc:
            await self._batch_failed(exc)
            return False
        except (Break, Continue):  # refused by the checker; never here
            return False
        return True

    async def _batch_failed(self, exc: SqlError) -> None:
        if self.trancount and (self.xact_abort or exc.level >= 20):
            await rollback_all(self)
        self.output.error(exc)

    def new_frame(self, declared: list[Declared], procedure: str | None = None) -> Frame:
        return new_frame(declared, procedure, self.nesting)

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
        return system_function(self, name)

    async def drop_temporary(self, frame: Frame) -> None:
        await drop_temporary(self, frame)

    def session_function(self, name: str, args: list[Value]) -> Value:
        return session_function(self, name, args)

    # ---- queries --------------------------------------------------------------------------------

    async def query(self, select: ast.Select, frame: Frame) -> ResultSet:
        """A SELECT that reads views, queues or table variables, on the SQL engine."""
        if select.top is not None:  # the engine would take a negative count for no limit
            t.top_count(await self.value(select.top, frame))
        if select.sql is None:
            select.sql = translate(select, self._schema(frame))
        translation = select.sql
        names = {s.name.lower() for s in translation.sources if s.kind == "queue"}
        views = [s for s in translation.sources if s.kind == "view"]
        broker_only = len(names) + len(views) == len(translation.sources)
        if names and names <= self.tables and broker_only:
            return await (
                joined_query(self, select, frame, views)
                if views
                else table_query(self, select, frame)
            )
        if "tsql_db_" in translation.sql:
            await self.databases.list()  # what DB_ID and DB_NAME read
        try:
            await self._load(translation, frame)
        except SqlError as exc:  # not a queue: a table of the broker's, or nothing
            if exc.number != 208 or not broker_only:
                raise
            if views:  # the broker's tables joined with catalog views
                result = await joined_query(self, select, frame, views)
            else:
                result = await table_query(self, select, frame)
            self.tables |= names
            return result
        return self.engine.run(
            translation, frame_parameters(translation, frame, self.system_function), _KINDS
        )

    @staticmethod
    def _schema(frame: Frame) -> Schema:
        """The types of the frame's table variables and variables, for a translation."""

        def table(key: str) -> Sequence[tuple[str, t.SqlType]] | None:
            slot = frame.variables.get(key)
            return None if slot is None or slot.table is None else slot.table.columns

        def variable(key: str) -> t.SqlType | None:
            slot = frame.variables.get(key)
            return None if slot is None or slot.table is not None else slot.type

        return Schema(table, variable)

    async def _table_change(self, statement: ast.TableChange, frame: Frame) -> None:
        """INSERT, UPDATE or DELETE of a table variable, on the SQL engine."""
        if statement.sql is None:
            statement.sql = translate_text(statement.text, self._schema(frame))
        translation: Translation = statement.sql
        slot = frame.variables[statement.variable]
        if slot.table is None:
            raise SqlError(1087, f'Must declare the table variable "{statement.variable}".')
        target = next(s for s in translation.sources if s.name == statement.variable)
        await self._load(translation, frame)
        count, rows = self.engine.modify(
            translation, frame_parameters(translation, frame, self.system_function), target
        )
        columns = slot.table.columns
        slot.table.admit(
            [
                [from_sqlite(v, kind) for v, (_, kind) in zip(row, columns, strict=True)]
                for row in rows
            ]
        )
        self.rowcount = count
        if not self.nocount:
            self.output.message(f"({count} row{'s' if count != 1 else ''} affected)")

    async def catalog_rows(self, source: Source, fetched: dict[str, list[Any]]) -> list[Any]:
        """The rows of catalog view `source` (the broker's views it reads are fetched
        into `fetched` once)."""
        view = SYS_VIEWS[source.name]
        for name in view.sources:
            if name not in fetched:
                fetched[name] = await self.view_rows(name)
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
        return view.build(fetched, self.databases.current())

    async def _load(self, translation: Translation, frame: Frame) -> None:
        """Every table a translated statement reads, into the SQL engine."""
        fetched: dict[str, list[Any]] = {}
        for source in translation.sources:
            if source.kind == "view":
                view = SYS_VIEWS[source.name]
                self.engine.load(source, view.columns, await self.catalog_rows(source, fetched))
            elif source.kind == "queue":
                rows = await self._peek(source.name)
                self.engine.load(source, queue_columns(), queue_table(rows))
            elif source.kind == "nodes":
                document = await self.value(ast.Variable(source.name, source.name), frame)
                if document.type.family != "xml":
                    raise SqlError(258, f"Cannot call methods on {document.type.name.lower()}.")
                nodes: list[Sequence[object]] = [
                    [node.data] for node in xml_rows(document, source.path)
                ]
                self.engine.load(source, ((source.column, t.XML),), nodes)
            else:
                slot = frame.variables.get(source.name)
                if slot is None or slot.table is None:
                    raise SqlError(1087, f'Must declare the table variable "{source.name}".')
                self.engine.load(
                    source, slot.table.columns, [[v.data for v in row] for row in slot.table.rows]
                )

    async def view_rows(self, name: str) -> list[dict[str, Any]]:
        """A view of the broker; of a database's objects, those of the current database
        (the broker's own objects, and the DMVs, are every database's)."""
        rows: list[dict[str, Any]] = await self.broker(self.connection().view(name))
        if name not in _PER_DATABASE:
            return rows
        current = self.databases.current()
        return [r for r in rows if r.get("database", current) in (None, current)]

    async def _peek(self, name: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await found(
            self.connection().view(f"queue:{name}"),
            SqlError(208, f"Invalid object name '{name}'."),
        )
        return rows

    async def subquery(self, node: ast.Expr, frame: Frame) -> Any:
        """The answer of a subquery: EXISTS -> bool, scalar -> Value, IN -> values; and of
        a function the broker answers (OBJECT_ID, DB_ID, DB_NAME)."""
        if isinstance(node, ast.Call):
            args = [self.sync(arg, frame) for arg in node.args]
            if node.name == "OBJECT_ID":
                return await self._object_id(args)
            await self.databases.list()  # what DB_ID and DB_NAME read
            return self.session_function(node.name, args)
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

    async def _object_id(self, args: list[Value]) -> Value:
        """OBJECT_ID('[schema.]name' [, 'type']): the id sys.objects gives a queue (SQ) or
        a procedure (P); NULL for anything else."""
        if not args or len(args) > 2 or args[0].data is None:
            return Value(None, t.INT)
        name = t.to_text(args[0]).rsplit(".", 1)[-1].strip()
        if name.startswith("[") and name.endswith("]"):
            name = name[1:-1].replace("]]", "]")
        kind = t.to_text(args[1]).strip().upper() if len(args) == 2 and args[1].data else None
        if kind in (None, "SQ"):
            queues = await self.view_rows("service_queues")
            if any(q["name"].lower() == name.lower() for q in queues):
                return Value(object_id("queue", name), t.INT)
        if kind in (None, "P"):
            found = await self.procedures.get(name)
            if found is not None:
                return Value(object_id("procedure", found.name), t.INT)
        return Value(None, t.INT)

    # ---- procedural statements ---------------------------------------------------------------

    async def _declare(self, statement: ast.Declare, frame: Frame) -> None:
        # a DECLARE made the variable when the batch began (see _frame): run again, in a
        # loop, only its `= value` assigns; a table variable keeps its rows, as in SQL Server
        for item in statement.items:
            if item.init is not None:
                self.assign(frame, item.key, await self.value(item.init, frame))

    async def _set_variable(self, statement: ast.SetVariable, frame: Frame) -> None:
        self.assign(frame, statement.key, await self.value(statement.expr, frame), statement.op)
        self.rowcount = 1

    async def _set_option(self, statement: ast.SetOption, frame: Frame) -> None:
        for option in statement.option.split(","):  # SET ANSI_NULLS, QUOTED_IDENTIFIER ON
            self._set_one_option(option, statement.value)
        self.rowcount = 0

    def _set_one_option(self, option: str, value: str) -> None:
        if option == "NOCOUNT":
            self.nocount = value == "ON"
        elif option == "PARSEONLY":
            self.parse_only = value == "ON"
        elif option == "XACT_ABORT":
            self.xact_abort = value == "ON"
        elif option in SQL_SERVER_DEFAULTS and value == "ON":
            pass  # ssb always behaves as these options ON say
        elif option == "TRANSACTION ISOLATION LEVEL" and value == "READ COMMITTED":
            pass  # what ssb's transactions give
        else:
            raise NotSupported(
                f"SET {option} {value}",
                "ssb's T-SQL knows SET NOCOUNT, XACT_ABORT, PARSEONLY, and ANSI_NULLS,"
                " QUOTED_IDENTIFIER, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL ON",
            )

    async def _select(self, statement: ast.SelectStatement, frame: Frame) -> None:
        select = statement.query
        if select.into is not None:
            if not select.into.startswith("#"):
                raise NotSupported(
                    "SELECT ... INTO a table",
                    "SELECT ... INTO #name, or CREATE TABLE first, then INSERT INTO table"
                    " SELECT ...",
                )
            await select_into(self, select, frame)
            return
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
        if select.top is not None and t.top_count(await self.value(select.top, frame)) == 0:
            self.rowcount = 0
            return
        values = [await self.value(item.expr, frame) for item in select.items]
        if select.assigns:
            if not all(item.target for item in select.items):
                raise assignment_with_retrieval()
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
            except Break:
                return
            except Continue:
                continue

    async def _break(self, statement: ast.Break, frame: Frame) -> None:
        raise Break

    async def _continue(self, statement: ast.Continue, frame: Frame) -> None:
        raise Continue

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

    async def _print(self, statement: ast.Print, frame: Frame) -> None:
        value = await self.value(statement.expr, frame)
        self.output.message("" if value.data is None else t.to_text(value))
        self.rowcount = 0

    async def _raiserror(self, statement: ast.RaiseError, frame: Frame) -> None:
        message = await self.value(statement.message, frame)
        severity = small_int(await self.value(statement.severity, frame))
        state = small_int(await self.value(statement.state, frame))
        args = [await self.value(a, frame) for a in statement.args]
        # as SQL Server takes RAISERROR's state (not as THROW's): past 255 refused, a
        # negative one read as 1
        if state > _MAX_STATE:
            raise SqlError(
                2756, f"Invalid value {state} for state. Valid range is from 0 to {_MAX_STATE}."
            )
        state = 1 if state < 0 else state
        if "SETERROR" in statement.options:
            raise NotSupported(
                "RAISERROR ... WITH SETERROR", "read ERROR_NUMBER() in a CATCH block instead"
            )
        if severity > _USER_SEVERITY and "LOG" not in statement.options:
            raise SqlError(
                2754,
                "Error severity levels greater than 18 can only be specified by members of the"
                " sysadmin role, using the WITH LOG option.",
            )
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
        # as SQL Server takes the arguments: the number an INT (NULL reads as 0), checked
        # before the state; the state a TINYINT of which only the low byte is kept, and a
        # negative one refused
        given = await self.value(statement.number, frame)
        number = 0 if given.data is None else t.as_int(t.convert(given, t.INT))
        assert statement.message is not None and statement.state is not None
        text = await self.text_value(statement.message, frame)
        if number < 50000:
            raise SqlError(
                35100,
                f"Error number {number} in the THROW statement is outside the valid range."
                " Specify an error number in the valid range of 50000 to 2147483647.",
                state=10,
            )
        state = small_int(await self.value(statement.state, frame))
        if state < 0:
            raise SqlError(
                2756, f"Invalid value {state} for state. State value must not be less than 0."
            )
        raise SqlError(number, text or "", level=16, state=state & 0xFF)

    async def _return(self, statement: ast.Return, frame: Frame) -> None:
        if statement.expr is None:
            raise Return(None)
        if frame.procedure is None:
            raise SqlError(
                178, "A RETURN statement with a return value cannot be used in this context."
            )
        value = await self.value(statement.expr, frame)
        raise Return(None if value.data is None else int(t.convert(value, t.INT).data))  # type: ignore[call-overload]

    async def _waitfor_delay(self, statement: ast.WaitforDelay, frame: Frame) -> None:
        value = await self.value(statement.delay, frame)
        moment = value.data
        if isinstance(moment, dt.datetime):  # a DATETIME's time of day, as SQL Server takes it
            hours, minutes, seconds = moment.hour, moment.minute, moment.second
            millis = moment.microsecond // 1000
        else:
            text = None if moment is None else t.to_text(value)
            match = re.fullmatch(
                r"\s*(\d{1,2}):(\d{1,2})(?::(\d{1,2})(?:\.(\d{1,3}))?)?\s*", text or ""
            )
            if match is None:
                raise _waitfor_syntax(text)
            hours, minutes, seconds = (int(part or 0) for part in match.groups()[:3])
            if hours > 23 or minutes > 59 or seconds > 59:  # a time of day, 23:59:59.999 at most
                raise _waitfor_syntax(text)
            millis = int((match.group(4) or "0").ljust(3, "0"))
        span = hours * 3600 + minutes * 60 + seconds + millis / 1000
        if statement.until:
            now = dt.datetime.now()
            target = now.replace(
                hour=hours, minute=minutes, second=seconds, microsecond=millis * 1000
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
            if statement.if_exists:
                folded = statement.name.casefold()
                if all(d.name.casefold() != folded for d in await self.databases.list()):
                    return
            await self.databases.drop(statement.name)
        else:
            await self.databases.alter(statement.name, statement.options)

    async def _refused(self, statement: ast.Refused, frame: Frame) -> None:
        raise NotSupported(statement.what, statement.instead)


def _bind(
    handler: Callable[..., Awaitable[None]], session: Session
) -> Callable[[Any, Frame], Awaitable[None]]:
    async def run(statement: Any, frame: Frame) -> None:
        await handler(session, statement, frame)

    return run


_USER_SEVERITY: Final = 18  # RAISERROR's highest severity without WITH LOG
_MAX_STATE: Final = 255  # RAISERROR's highest state


def _waitfor_syntax(text: str | None) -> SqlError:
    return SqlError(148, f"Incorrect time syntax in time string '{text}' used with WAITFOR.")


def _column_name(item: ast.SelectItem) -> str:
    if item.alias is not None:
        return item.alias
    if isinstance(item.expr, ast.Column):
        return item.expr.name
    return ""
