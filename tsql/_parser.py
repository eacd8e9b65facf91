"""The statement parser: a batch's tokens to a list of statements.

Theory of operation. Recursive descent over SQL Server's statement grammar, one
method per statement, with the expression and SELECT grammar beneath it
(_parse_expr) and Service Broker's statements beside it (_parse_broker). A statement
ends where its grammar ends; `;` between statements is optional, as in SQL Server.
`BEGIN` starts a block, a transaction, TRY, a dialog or a conversation timer; `END`
closes a block unless CONVERSATION follows. CREATE PROCEDURE takes the rest of the
batch as its body, as SQL Server does. The first syntax error stops the batch before
anything of it runs (Msg 102 / 156, with the line and column of the token).
"""

from __future__ import annotations

from typing import Final

from . import _ast as ast
from ._cursor import STATEMENT_WORDS
from ._errors import NotSupported, SqlError
from ._lexer import Kind, tokenize
from ._parse_tables import TABLE_OBJECTS, TableParser
from ._types import SqlType

_COMPOUND = ("=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=")
# the options of ALTER DATABASE ... SET that are a database's broker state, written alone
BROKER_OPTIONS = ("ENABLE_BROKER", "NEW_BROKER", "DISABLE_BROKER", "ERROR_BROKER_CONVERSATIONS")


def parse_batch(text: str, first_line: int = 1) -> list[ast.Statement]:
    """The statements of one batch (lines counted from `first_line`).

    Raises:
        SqlError: a syntax error (level 15) or an option ssb refuses (40517).
    """
    parser = Parser(text, first_line)
    return parser.statements()


class Parser(TableParser):
    def __init__(self, text: str, first_line: int = 1) -> None:
        super().__init__(tokenize(text, first_line), text)
        self.statement_start = self.token

    def statements(self) -> list[ast.Statement]:
        found: list[ast.Statement] = []
        while True:
            while self.take_op(";"):
                pass
            if self.at_end:
                return found
            first = not found
            found.append(self.statement(first=first))

    def block_until(self, *closers: str) -> list[ast.Statement]:
        """Statements up to END (not END CONVERSATION) or one of `closers`."""
        body: list[ast.Statement] = []
        while True:
            while self.take_op(";"):
                pass
            if self.at_end:
                self.fail()
            if self.at("END") and self.peek().upper != "CONVERSATION":
                return body
            body.append(self.statement())

    def statement(self, *, first: bool = False) -> ast.Statement:
        token = self.token
        line = token.line
        if token.kind is not Kind.NAME:
            if token.kind is Kind.OP and token.text == "(" and self.peek().upper == "SELECT":
                return ast.SelectStatement(line, self.select())
            self.fail()
        word = token.upper
        self.statement_start = token
        method = _STATEMENTS.get(word)
        if method is not None:
            if word not in ("SELECT", "WITH"):
                self.advance()
            return method(self, line)
        if (
            first
            and self.peek().kind
            in (Kind.END, Kind.VARIABLE, Kind.STRING, Kind.NSTRING, Kind.INTEGER)
        ) or (first and self.peek().text in (";", ".")):
            return self._execute(line)  # a procedure named alone as the batch's first word
        self.fail()

    # ---- procedural T-SQL ------------------------------------------------------------------

    def _select(self, line: int) -> ast.Statement:
        return ast.SelectStatement(line, self.select())

    def _declare(self, line: int) -> ast.Statement:
        items: list[ast.DeclareItem] = []
        while True:
            variable = self.variable()
            self.take("AS")
            if self.take("TABLE"):
                columns, constraints = self._table_columns()
                items.append(
                    ast.DeclareItem(variable.text, variable.upper, None, None, columns, constraints)
                )
            elif self.at("CURSOR"):
                raise NotSupported(
                    "DECLARE ... CURSOR", "loop with WHILE and RECEIVE TOP (1) or a table variable"
                ).at(line)
            else:
                kind = self.data_type()
                init = self.expression() if self.take_op("=") else None
                items.append(ast.DeclareItem(variable.text, variable.upper, kind, init))
            if not self.take_op(","):
                return ast.Declare(line, items)

    def _table_columns(
        self,
    ) -> tuple[tuple[tuple[str, SqlType], ...], ast.TableConstraints]:
        """A table variable's columns and the constraints it keeps: NULL / NOT NULL,
        PRIMARY KEY, UNIQUE (of a column or of several) and INDEX; the others refused."""
        line = self.expect_op("(").line
        columns: list[tuple[str, SqlType]] = []
        not_null: set[str] = set()
        keys: dict[str, list[tuple[str, ...]]] = {"PRIMARY": [], "UNIQUE": []}
        while True:
            if self.at("PRIMARY", "UNIQUE", "INDEX", "CHECK", "CONSTRAINT"):
                self._table_constraint(None, not_null, keys)
            else:
                name = self.name()
                columns.append((name, self.data_type()))
                while not self.at_op(",", ")") and not self.at_end:
                    if self.take("NOT"):
                        self.expect("NULL")
                        not_null.add(name.lower())
                    elif not self.take("NULL"):
                        self._table_constraint(name, not_null, keys)
            if not self.take_op(","):
                break
        self.expect_op(")")
        positions = {name.lower(): index for index, (name, _) in enumerate(columns)}
        for name in not_null.union(*keys["PRIMARY"], *keys["UNIQUE"]):
            if name not in positions:
                raise SqlError(
                    1911, f"Column name '{name}' does not exist in the target table."
                ).at(line)
        if len(keys["PRIMARY"]) > 1:
            raise SqlError(8110, "Cannot add multiple PRIMARY KEY constraints to table.").at(
                self.token.line
            )
        placed = {
            kind: tuple(tuple(positions[name] for name in key) for key in found)
            for kind, found in keys.items()
        }
        return tuple(columns), ast.TableConstraints(
            frozenset(positions[name] for name in not_null),
            placed["PRIMARY"][0] if placed["PRIMARY"] else (),
            placed["UNIQUE"],
        )

    def _table_constraint(
        self, column: str | None, not_null: set[str], keys: dict[str, list[tuple[str, ...]]]
    ) -> None:
        """One constraint of a table variable, of `column` or (None) of the table: a key
        goes into `keys` under PRIMARY or UNIQUE, a primary key's columns also into
        `not_null`."""
        if self.take("CONSTRAINT"):
            self.name()
        primary = bool(self.take("PRIMARY"))
        if primary:
            self.expect("KEY")
        elif self.take("INDEX"):
            self.name()
            if not self.take("UNIQUE"):  # an index changes no answer
                self.take("CLUSTERED", "NONCLUSTERED")
                if self.at_op("("):
                    self._skip_parenthesised()
                return
        elif not self.take("UNIQUE"):
            what = self.token.text.upper()
            raise NotSupported(
                f"{what} in a table variable",
                "a temporary table (CREATE TABLE #name) takes DEFAULT, IDENTITY and CHECK",
            ).at(self.token.line)
        self.take("CLUSTERED", "NONCLUSTERED")
        key: list[str] = []
        if self.take_op("("):
            while True:
                key.append(self.name().lower())
                self.take("ASC", "DESC")
                if not self.take_op(","):
                    break
            self.expect_op(")")
        elif column is not None:
            key.append(column.lower())
        else:
            self.fail()
        if self.at("WITH"):
            raise NotSupported(
                "WITH options of a table variable's key", "declare the key without them"
            ).at(self.token.line)
        keys["PRIMARY" if primary else "UNIQUE"].append(tuple(key))
        if primary:
            not_null.update(key)

    def _set(self, line: int) -> ast.Statement:
        token = self.token
        if token.kind is Kind.VARIABLE:
            self.advance()
            op = self.token
            if op.kind is not Kind.OP or op.text not in _COMPOUND:
                self.fail()
            self.advance()
            return ast.SetVariable(line, token.text, token.upper, op.text, self.expression())
        if token.kind is not Kind.NAME:
            self.fail()
        option = self.advance().upper
        if option == "TRANSACTION":
            self.expect("ISOLATION")
            self.expect("LEVEL")
            words = []
            while self.at(
                "READ", "UNCOMMITTED", "COMMITTED", "REPEATABLE", "SERIALIZABLE", "SNAPSHOT"
            ):
                words.append(self.advance().upper)
            return ast.SetOption(line, "TRANSACTION ISOLATION LEVEL", " ".join(words))
        names = [option]
        while self.take_op(","):
            names.append(
                self.expect(*_SET_OPTIONS).upper if self.at(*_SET_OPTIONS) else self.advance().upper
            )
        value = self.token
        if value.kind is Kind.NAME and value.upper in ("ON", "OFF"):
            self.advance()
            text = value.upper
        elif _SWITCHES.intersection(names):  # SET option { ON | OFF }: nothing else
            self.fail()
        elif value.kind in (Kind.INTEGER, Kind.STRING, Kind.NSTRING, Kind.NAME):
            self.advance()
            text = str(value.value)
        else:
            self.fail()
        return ast.SetOption(line, ",".join(names), text)

    def _if(self, line: int) -> ast.Statement:
        condition = self.expression()
        then = self.statement()
        otherwise = None
        while self.take_op(";"):
            pass
        if self.take("ELSE"):
            otherwise = self.statement()
        return ast.If(line, condition, then, otherwise)

    def _while(self, line: int) -> ast.Statement:
        condition = self.expression()
        return ast.While(line, condition, self.statement())

    def _begin(self, line: int) -> ast.Statement:
        if self.take("TRY"):
            body = self.block_until()
            self.expect("END")
            self.expect("TRY")
            while self.take_op(";"):
                pass
            self.expect("BEGIN")
            self.expect("CATCH")
            handler = self.block_until()
            self.expect("END")
            self.expect("CATCH")
            return ast.TryCatch(line, body, handler)
        if self.take("TRAN", "TRANSACTION"):
            return ast.Transaction(line, "BEGIN", self._transaction_name())
        if self.at("DISTRIBUTED"):
            raise NotSupported("BEGIN DISTRIBUTED TRANSACTION", "use BEGIN TRANSACTION").at(line)
        if self.at("DIALOG"):
            return self.begin_dialog(line)
        if self.take("CONVERSATION"):
            return self.conversation_timer(line)
        body = self.block_until()
        self.expect("END")
        return ast.Block(line, body)

    def _transaction_name(self) -> str | None:
        token = self.token
        if token.kind is Kind.VARIABLE:
            self.advance()
            return token.upper
        if self.is_name(token) and not (
            token.kind is Kind.NAME
            and (token.upper in _STATEMENTS or token.upper in STATEMENT_WORDS)
        ):
            self.advance()
            name = str(token.value)
            if self.take("WITH"):
                self.expect("MARK")
                if self.token.kind in (Kind.STRING, Kind.NSTRING):
                    self.advance()
            return name
        return None

    def _commit(self, line: int) -> ast.Statement:
        self.take("TRAN", "TRANSACTION", "WORK")
        return ast.Transaction(line, "COMMIT", self._transaction_name())

    def _rollback(self, line: int) -> ast.Statement:
        self.take("TRAN", "TRANSACTION", "WORK")
        return ast.Transaction(line, "ROLLBACK", self._transaction_name())

    def _save(self, line: int) -> ast.Statement:
        self.expect("TRAN", "TRANSACTION")
        return ast.Transaction(line, "SAVE", self._transaction_name())

    def _print(self, line: int) -> ast.Statement:
        return ast.Print(line, self.expression())

    def _raiserror(self, line: int) -> ast.Statement:
        parenthesised = self.take_op("(") is not None
        if not parenthesised:
            raise SqlError(102, f"Incorrect syntax near '{self.token.text}'.", level=15, line=line)
        message = self.expression()
        self.expect_op(",")
        severity = self.expression()
        self.expect_op(",")
        state = self.expression()
        args = []
        while self.take_op(","):
            args.append(self.expression())
        self.expect_op(")")
        options = []
        if self.take("WITH"):
            while True:
                options.append(self.expect("LOG", "NOWAIT", "SETERROR").upper)
                if not self.take_op(","):
                    break
        return ast.RaiseError(line, message, severity, state, args, options)

    def _throw(self, line: int) -> ast.Statement:
        if (
            self.at_end
            or self.at_op(";")
            or (self.token.kind is Kind.NAME and self.token.upper in ("END",))
        ):
            return ast.Throw(line)
        number = self.expression()
        self.expect_op(",")
        message = self.expression()
        self.expect_op(",")
        return ast.Throw(line, number, message, self.expression())

    def _return(self, line: int) -> ast.Statement:
        token = self.token
        if (
            token.kind in (Kind.END,)
            or (token.kind is Kind.OP and token.text == ";")
            or (token.kind is Kind.NAME and token.upper in _NO_RETURN_VALUE)
        ):
            return ast.Return(line, None)
        return ast.Return(line, self.expression())

    def _break(self, line: int) -> ast.Statement:
        return ast.Break(line)

    def _continue(self, line: int) -> ast.Statement:
        return ast.Continue(line)

    def _execute(self, line: int) -> ast.Statement:
        result = None
        if self.token.kind is Kind.VARIABLE and self.peek().text == "=":
            result = self.advance().upper
            self.advance()
        if self.at_op("("):
            raise NotSupported(
                "EXECUTE (string): dynamic SQL", "write the statement itself in the script"
            ).at(line)
        procedure = self.dotted_name()
        if procedure.upper() in ("SP_EXECUTESQL",):
            raise NotSupported("sp_executesql: dynamic SQL", "write the statement itself").at(line)
        arguments: list[ast.Argument] = []
        if not self.at_end and not self.at_op(";") and self._starts_argument():
            while True:
                arguments.append(self._argument())
                if not self.take_op(","):
                    break
        if self.take("WITH"):
            raise NotSupported("EXECUTE ... WITH RECOMPILE / RESULT SETS", "omit WITH").at(line)
        return ast.Execute(line, procedure, arguments, result)

    def _starts_argument(self) -> bool:
        token = self.token
        if token.kind is Kind.NAME:
            return token.upper in ("DEFAULT", "NULL") or token.upper not in _STATEMENTS
        return token.kind is not Kind.END

    def _argument(self) -> ast.Argument:
        name = None
        written = ""
        if self.token.kind is Kind.VARIABLE and self.peek().text == "=":
            written = self.token.text
            name = self.advance().upper
            self.advance()
        if self.take("DEFAULT"):
            return ast.Argument(name, None, written=written)
        token = self.token
        if self.is_name(token) and token.kind is Kind.NAME and self.peek().text != "(":
            self.advance()  # a bare word is a string argument, as SQL Server reads it
            from ._parse_broker import _text

            expr: ast.Expr = ast.Literal(_text(str(token.value)))
        else:
            expr = self.expression()
        output = self.take("OUTPUT", "OUT") is not None
        return ast.Argument(name, expr, output, written)

    def _use(self, line: int) -> ast.Statement:
        return ast.Use(line, self.name())

    # ---- CREATE / ALTER / DROP -----------------------------------------------------------------

    def _create(self, line: int) -> ast.Statement:
        if self.at("OR") and self.peek().upper == "ALTER":
            self.i += 2
            self.expect("PROCEDURE", "PROC")
            return self._procedure(line, "CREATE", or_alter=True)
        return self._object(line, "CREATE")

    def _alter(self, line: int) -> ast.Statement:
        return self._object(line, "ALTER")

    def _drop(self, line: int) -> ast.Statement:
        return self._object(line, "DROP")

    def _object(self, line: int, action: str) -> ast.Statement:
        start = self.statement_start
        kind = self.token
        if kind.kind is not Kind.NAME:
            self.fail()
        word = kind.upper
        self.advance()
        if word in ("PROCEDURE", "PROC"):
            if action == "DROP":
                return self._drop_procedure(line)
            return self._procedure(line, action)
        broker_object = self.broker_object(line, action, word)
        if broker_object is not None:
            return broker_object
        if word == "DATABASE":
            return self._database(line, action)
        if word == "LOGIN":
            return self._login(line, action)
        if word in TABLE_OBJECTS:
            return self.table_object(line, start, action, word)
        refusal = _REFUSED.get(word)
        if refusal is not None:
            return self._refused_rest(line, f"{action} {refusal[0]}", refusal[1])
        if action == "DROP" and word == "IF":
            self.fail(kind)
        raise NotSupported(
            f"{action} {word}",
            "ssb's T-SQL has the objects of Service Broker (message types, contracts, queues,"
            " services, routes, broker priorities, event notifications, remote service"
            " bindings, certificates), procedures, databases and logins",
        ).at(line)

    def _procedure(self, line: int, action: str, *, or_alter: bool = False) -> ast.Statement:
        start = self.statement_start
        name = self.dotted_name()
        if self.take_op(";"):
            self.fail()
        parameters: list[ast.Parameter] = []
        parenthesised = self.take_op("(") is not None
        if self.token.kind is Kind.VARIABLE:
            while True:
                variable = self.variable()
                self.take("AS")
                kind = self.data_type()
                default = self.expression() if self.take_op("=") else None
                output = self.take("OUTPUT", "OUT") is not None
                if self.take("READONLY"):
                    raise NotSupported("READONLY table parameters", "pass values").at(line)
                parameters.append(
                    ast.Parameter(variable.text, variable.upper, kind, default, output)
                )
                if not self.take_op(","):
                    break
        if parenthesised:
            self.expect_op(")")
        execute_as: str | None = None
        if self.take("WITH"):
            while True:
                option = self.expect("EXECUTE", "RECOMPILE", "ENCRYPTION").upper
                if option == "EXECUTE":
                    self.expect("AS")
                    who = self.advance()
                    execute_as = who.upper if who.kind is Kind.NAME else str(who.value)
                if not self.take_op(","):
                    break
        self.expect("AS")
        body = self.statements()
        text = self.text[start.start :]
        return ast.CreateProcedure(
            line, name, parameters, body, text, action == "ALTER", or_alter, execute_as
        )

    def _drop_procedure(self, line: int) -> ast.Statement:
        if_exists = self.at_seq("IF", "EXISTS")
        if if_exists:
            self.i += 2
        names = [self.dotted_name()]
        while self.take_op(","):
            names.append(self.dotted_name())
        return ast.DropProcedure(line, names, if_exists)

    def _database(self, line: int, action: str) -> ast.Statement:
        if_exists = action == "DROP" and self.at_seq("IF", "EXISTS")
        if if_exists:
            self.i += 2
        name = self.name()
        options: dict[str, str] = {}
        if action == "ALTER":
            self.expect("SET")
            while True:
                option = self.advance()
                if option.kind is not Kind.NAME:
                    self.fail(option)
                if option.upper in BROKER_OPTIONS:
                    options[option.upper] = "ON"
                else:
                    self.take_op("=")
                    options[option.upper] = self.advance().upper
                if not self.take_op(","):
                    break
            if self.take("WITH"):
                self.expect("ROLLBACK", "NO_WAIT")
                if self.take("AFTER"):
                    self.advance()
                    self.take("SECONDS")
                else:
                    self.take("IMMEDIATE")
        elif action == "CREATE" and (
            self.at("ON", "COLLATE", "WITH", "CONTAINMENT") or self.at_op("(")
        ):
            return self._refused_rest(
                line, "CREATE DATABASE with files or options", "CREATE DATABASE name alone"
            )
        return ast.Database(line, action, name, options, if_exists)

    def _login(self, line: int, action: str) -> ast.Statement:
        name = self.name()
        options: dict[str, object] = {}
        if action != "DROP":
            if self.take("FROM"):
                return self._refused_rest(
                    line,
                    f"{action} LOGIN ... FROM (Windows, certificate or key)",
                    "ssb's logins have passwords: CREATE LOGIN name WITH PASSWORD = '...'",
                )
            self.expect("WITH")
            self.expect("PASSWORD")
            self.expect_op("=")
            options["password"] = self.expression()
            while self.take_op(","):
                self.advance()
                self.take_op("=")
                self.advance()
                options["extra"] = True
        return ast.Ddl(line, action, "login", name, options)

    def _grant(self, line: int) -> ast.Statement:
        return self._permission(line, "GRANT")

    def _revoke(self, line: int) -> ast.Statement:
        return self._permission(line, "REVOKE")

    def _deny(self, line: int) -> ast.Statement:
        return self._refused_rest(line, "DENY", "ssb has grants only: REVOKE what was granted")

    def _permission(self, line: int, action: str) -> ast.Statement:
        start = self.i
        permissions = [self._words(("ON", "TO", "FROM"))]
        while self.take_op(","):
            permissions.append(self._words(("ON", "TO", "FROM")))
        options: dict[str, object] = {"permissions": permissions}
        if self.take("ON"):
            kind = "OBJECT"
            if any(t.text == "::" for t in self.tokens[self.i : self.i + 4]):
                kind = self._words(())
                self.expect_op("::")
            options["kind"] = kind
            options["object"] = self.dotted_name()
        self.expect("TO", "FROM")
        options["login"] = self.name()
        while self.take_op(","):
            self.i = start
            return self._refused_rest(
                line, f"{action} to several principals", "grant each login in its own statement"
            )
        if self.take("WITH"):
            self.expect("GRANT")
            self.expect("OPTION")
            return self._refused_rest(
                line, "WITH GRANT OPTION", "CONTROL on the object lets a login grant"
            )
        self.take("CASCADE")
        if self.take("AS"):
            self.name()
        return ast.Ddl(line, action, "permission", ",".join(permissions), options)

    def _words(self, stops: tuple[str, ...]) -> str:
        """Plain words up to `::`, `,` or one of `stops` (CREATE QUEUE, MESSAGE TYPE)."""
        words = []
        while self.token.kind is Kind.NAME and self.token.upper not in stops:
            words.append(self.advance().upper)
        if not words:
            self.fail()
        return " ".join(words)

    def _execute_as(self, line: int) -> ast.Statement:
        return self._refused_rest(
            line,
            "EXECUTE AS / REVERT",
            "connect as the login itself (ssb sql --url ssb://LOGIN:PASSWORD@...)",
        )

    def _exec_statement(self, line: int) -> ast.Statement:
        if self.at("AS"):
            return self._execute_as(line)
        return self._execute(line)

    def _revert(self, line: int) -> ast.Statement:
        return ast.Refused(line, "REVERT", "connect as the login itself")

    def _end(self, line: int) -> ast.Statement:
        if not self.at("CONVERSATION"):
            self.fail(self.tokens[self.i - 1])
        return self.end_conversation(line)

    def _backup(self, line: int) -> ast.Statement:
        return self._refused_rest(
            line,
            "BACKUP",
            "back up the whole broker with `ssb backup DIR`; a broker's certificate is"
            " broker_certificate() of the client",
        )

    def _refused_statement(self, line: int) -> ast.Statement:
        word = self.tokens[self.i - 1].upper
        what, instead = _REFUSED_STATEMENTS[word]
        return self._refused_rest(line, what, instead)


_NO_RETURN_VALUE = frozenset(
    [
        "BEGIN",
        "COMMIT",
        "DECLARE",
        "ELSE",
        "END",
        "IF",
        "PRINT",
        "RAISERROR",
        "RETURN",
        "ROLLBACK",
        "SELECT",
        "SEND",
        "SET",
        "THROW",
        "WHILE",
        "WAITFOR",
    ]
)
_SET_OPTIONS = frozenset(("NOCOUNT", "XACT_ABORT", "ANSI_NULLS", "QUOTED_IDENTIFIER"))
# the SET options ON by default in SQL Server (ssb behaves as they say, and takes only ON)
SQL_SERVER_DEFAULTS: Final = frozenset(
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
# the SET options SQL Server's grammar gives ON or OFF, and no other value
_SWITCHES: Final = SQL_SERVER_DEFAULTS | frozenset(
    (
        "NOCOUNT",
        "XACT_ABORT",
        "PARSEONLY",
        "ANSI_NULL_DFLT_OFF",
        "ANSI_DEFAULTS",
        "IMPLICIT_TRANSACTIONS",
        "NOEXEC",
        "FMTONLY",
        "NUMERIC_ROUNDABORT",
        "CURSOR_CLOSE_ON_COMMIT",
        "FORCEPLAN",
    )
)
_REFUSED = {
    "MASTER": ("MASTER KEY", "ssb keeps its keys in its data directory; nothing to create"),
    "USER": (
        "USER",
        "ssb has logins only: CREATE LOGIN name WITH PASSWORD = '...', and GRANT to it",
    ),
    "ENDPOINT": (
        "ENDPOINT",
        "the broker port is ssb's own: ssb serve --broker-port N (4022 by default)",
    ),
    "SCHEMA": ("SCHEMA", "ssb's objects have no schemas; name them alone"),
    "VIEW": ("VIEW", "ssb has no user views; SELECT from the catalog views"),
    "FUNCTION": ("FUNCTION", "ssb has no user functions yet; use a procedure"),
    "TRIGGER": ("TRIGGER", "ssb has no triggers; use activation or event notifications"),
    "SYMMETRIC": (
        "SYMMETRIC KEY",
        "ssb keeps its keys; dialogs are encrypted with ENCRYPTION = ON",
    ),
    "ASYMMETRIC": ("ASYMMETRIC KEY", "ssb keeps its keys"),
    "ROLE": ("ROLE", "grant permissions to logins directly"),
    "XML": ("XML SCHEMA COLLECTION", "validate with WELL_FORMED_XML and check in code"),
    "TYPE": ("TYPE", "use the built-in types"),
    "SYNONYM": ("SYNONYM", "name the object itself"),
    "SEQUENCE": ("SEQUENCE", "ssb has no sequences"),
    "CREDENTIAL": ("CREDENTIAL", "ssb logs in with its own logins"),
}
_REFUSED_STATEMENTS = {
    "TRUNCATE": ("TRUNCATE TABLE", "use DELETE FROM the table"),
    "GOTO": ("GOTO", "use IF, WHILE, BREAK and CONTINUE"),
    "OPEN": ("cursors", "loop with WHILE"),
    "FETCH": ("cursors", "loop with WHILE"),
    "CLOSE": ("cursors", "loop with WHILE"),
    "DEALLOCATE": ("cursors", "loop with WHILE"),
    "DBCC": ("DBCC", "ssb diagnose URL finds what keeps messages from flowing"),
    "KILL": ("KILL", "stop a session by dropping its login's connection"),
}

_STATEMENTS = {
    "SELECT": Parser._select,
    "WITH": Parser._select,
    "DECLARE": Parser._declare,
    "SET": Parser._set,
    "IF": Parser._if,
    "WHILE": Parser._while,
    "BEGIN": Parser._begin,
    "COMMIT": Parser._commit,
    "ROLLBACK": Parser._rollback,
    "SAVE": Parser._save,
    "PRINT": Parser._print,
    "RAISERROR": Parser._raiserror,
    "THROW": Parser._throw,
    "RETURN": Parser._return,
    "BREAK": Parser._break,
    "CONTINUE": Parser._continue,
    "EXEC": Parser._exec_statement,
    "EXECUTE": Parser._exec_statement,
    "USE": Parser._use,
    "CREATE": Parser._create,
    "ALTER": Parser._alter,
    "DROP": Parser._drop,
    "GRANT": Parser._grant,
    "REVOKE": Parser._revoke,
    "DENY": Parser._deny,
    "REVERT": Parser._revert,
    "END": Parser._end,
    "SEND": Parser.send,
    "RECEIVE": Parser.receive,
    "GET": Parser.get_group,
    "MOVE": Parser.move_conversation,
    "WAITFOR": Parser.waitfor,
    "BACKUP": Parser._backup,
    "INSERT": Parser._insert,
    "UPDATE": Parser._update,
    "DELETE": Parser._delete,
    "MERGE": Parser._merge,
    **dict.fromkeys(_REFUSED_STATEMENTS, Parser._refused_statement),
}
