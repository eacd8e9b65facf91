"""Service Broker's statements: the conversation statements and the DDL of message
types, contracts, queues, services, routes, broker priorities, event notifications,
remote service bindings and certificates; databases, logins and permissions; and the
statements of SQL Server ssb parses but refuses (master keys, users, endpoints ...).

Each DDL statement becomes an `ast.Ddl` whose options are already the client's
arguments' words (validation names, SENT BY sides, queue options), so that running it
is one client call. An option Service Broker has and ssb does not is refused here, at
parse time, with what to do instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from . import _ast as ast
from ._errors import NotSupported
from ._lexer import Kind
from ._parse_expr import ExpressionParser

_ON_OFF = ("ON", "OFF")


class BrokerParser(ExpressionParser):
    # ---- conversations -------------------------------------------------------------------

    def begin_dialog(self, line: int) -> ast.Statement:
        self.expect("DIALOG")
        self.take("CONVERSATION")
        handle = self.variable()
        self.expect("FROM")
        self.expect("SERVICE")
        from_service = self._object_name_expr()
        self.expect("TO")
        self.expect("SERVICE")
        to_service = self.expression()
        instance = self.expression() if self.take_op(",") else None
        contract = None
        if self.take("ON"):
            self.expect("CONTRACT")
            contract = self._object_name_expr()
        statement = ast.BeginDialog(
            line, handle.upper, handle.text, from_service, to_service, instance, contract
        )
        if self.take("WITH"):
            while True:
                option = self.expect(
                    "RELATED_CONVERSATION", "RELATED_CONVERSATION_GROUP", "LIFETIME", "ENCRYPTION"
                ).upper
                self.expect_op("=")
                if option == "ENCRYPTION":
                    statement.encryption = self.expect(*_ON_OFF).upper == "ON"
                elif option == "LIFETIME":
                    statement.lifetime = self.expression()
                elif option == "RELATED_CONVERSATION":
                    statement.related_conversation = self.expression()
                else:
                    statement.related_group = self.expression()
                if not self.take_op(",") and not self.at(
                    "RELATED_CONVERSATION",
                    "RELATED_CONVERSATION_GROUP",
                    "LIFETIME",
                    "ENCRYPTION",
                ):
                    break
        return statement

    def _object_name_expr(self) -> ast.Expr:
        """A service, contract or message type name: an identifier, or an expression
        (a variable or a string) where SQL Server allows one."""
        token = self.token
        if token.kind in (Kind.NAME, Kind.QUOTED):
            name = self.dotted_name()
            return ast.Literal(_text(name))
        return self.expression()

    def send(self, line: int) -> ast.Statement:
        self.expect("ON")
        self.expect("CONVERSATION")
        handles: list[ast.Expr] = []
        if self.take_op("("):
            handles.append(self.expression())
            while self.take_op(","):
                handles.append(self.expression())
            self.expect_op(")")
        else:
            handles.append(self.expression())
            while self.take_op(","):
                handles.append(self.expression())
        message_type = None
        if self.take("MESSAGE"):
            self.expect("TYPE")
            message_type = self._object_name_expr()
        body = None
        if self.take_op("("):
            body = self.expression()
            self.expect_op(")")
        return ast.Send(line, handles, message_type, body)

    def receive(self, line: int) -> ast.Receive:
        top = None
        if self.take("TOP"):
            self.expect_op("(")
            top = self.expression()
            self.expect_op(")")
        items = [self._select_item()]
        while self.take_op(","):
            items.append(self._select_item())
        self.expect("FROM")
        queue = self.dotted_name()
        into = None
        if self.take("INTO"):
            into = self.variable().upper
        statement = ast.Receive(line, queue, tuple(items), top, into)
        if self.take("WHERE"):
            self._receive_where(statement)
        return statement

    def _receive_where(self, statement: ast.Receive) -> None:
        column = self.token
        if column.kind is not Kind.NAME or column.upper not in (
            "CONVERSATION_HANDLE",
            "CONVERSATION_GROUP_ID",
        ):
            self.fail()
        self.advance()
        self.expect_op("=")
        statement.where_column = column.upper.lower()
        statement.where_value = self.expression()

    def get_group(self, line: int) -> ast.Receive:
        self.expect("CONVERSATION")
        self.expect("GROUP")
        variable = self.variable()
        self.expect("FROM")
        queue = self.dotted_name()
        return ast.Receive(
            line, queue, (), group_variable=variable.upper, group_variable_name=variable.text
        )

    def waitfor(self, line: int) -> ast.Statement:
        if self.take("DELAY"):
            return ast.WaitforDelay(line, self.expression(), until=False)
        if self.take("TIME"):
            return ast.WaitforDelay(line, self.expression(), until=True)
        self.expect_op("(")
        inner_line = self.token.line
        if self.take("RECEIVE"):
            statement = self.receive(inner_line)
        elif self.take("GET"):
            statement = self.get_group(inner_line)
        else:
            self.fail()
        self.expect_op(")")
        statement.waitfor = True
        if self.take_op(","):
            self.expect("TIMEOUT")
            statement.timeout = self.expression()
        return statement

    def end_conversation(self, line: int) -> ast.Statement:
        self.expect("CONVERSATION")
        statement = ast.EndConversation(line, self.expression())
        if self.take("WITH"):
            if self.take("CLEANUP"):
                statement.cleanup = True
            else:
                self.expect("ERROR")
                self.expect_op("=")
                statement.error = self.expression()
                self.expect("DESCRIPTION")
                self.expect_op("=")
                statement.description = self.expression()
        return statement

    def conversation_timer(self, line: int) -> ast.Statement:
        self.expect("TIMER")
        self.expect_op("(")
        handle = self.expression()
        self.expect_op(")")
        self.expect("TIMEOUT")
        self.expect_op("=")
        return ast.ConversationTimer(line, handle, self.expression())

    def move_conversation(self, line: int) -> ast.Statement:
        self.expect("CONVERSATION")
        handle = self.expression()
        self.expect("TO")
        return ast.MoveConversation(line, handle, self.expression())

    # ---- DDL -------------------------------------------------------------------------------

    def broker_object(self, line: int, action: str, word: str) -> ast.Statement | None:
        """CREATE, ALTER or DROP of the Service Broker object whose kind's first word is
        `word` (read already); None when no kind begins with it. A DROP names the object
        and says no more, but for an event notification's, which names its queue."""
        found = _OBJECTS.get(word)
        if found is None:
            return None
        kind, words, rest = found
        for each in words:
            self.expect(each)
        name = self.dotted_name()
        if action == "DROP" and kind != "event_notification":
            return ast.Ddl(line, action, kind, name)
        return rest(self, line, action, name)

    def message_type(self, line: int, action: str, name: str) -> ast.Statement:
        options: dict[str, Any] = {}
        self._authorization(options)
        if self.take("VALIDATION"):
            self.expect_op("=")
            validation = self.expect(
                "NONE", "EMPTY", "WELL_FORMED_XML", "VALID_XML", "VALID_JSON"
            ).upper
            if validation == "VALID_XML":
                raise NotSupported(
                    "VALIDATION = VALID_XML WITH SCHEMA COLLECTION",
                    "ssb has no XML schema collections; use WELL_FORMED_XML and check the"
                    " schema in the receiving code",
                ).at(line)
            options["validation"] = validation
        return ast.Ddl(line, action, "message_type", name, options)

    def contract(self, line: int, action: str, name: str) -> ast.Statement:
        options: dict[str, Any] = {}
        if action == "CREATE":
            self._authorization(options)
            self.expect_op("(")
            messages: dict[str, str] = {}
            while True:
                message = "DEFAULT" if self.take("DEFAULT") else self.dotted_name()
                self.expect("SENT")
                self.expect("BY")
                messages[message] = self.expect("INITIATOR", "TARGET", "ANY").upper
                if not self.take_op(","):
                    break
            self.expect_op(")")
            options["messages"] = messages
        return ast.Ddl(line, action, "contract", name, options)

    def queue(self, line: int, action: str, name: str) -> ast.Statement:
        options: dict[str, Any] = {}
        if action == "ALTER" and self.at("REBUILD", "REORGANIZE", "MOVE"):
            raise NotSupported(
                f"ALTER QUEUE ... {self.token.upper}",
                "ssb's queues live in its store, which keeps its own pages; nothing to rebuild",
            ).at(line)
        if self.take("WITH"):
            while True:
                option = self.expect(
                    "STATUS", "RETENTION", "ACTIVATION", "POISON_MESSAGE_HANDLING"
                ).upper
                if option in ("STATUS", "RETENTION"):
                    self.expect_op("=")
                    options[option.lower()] = self.expect(*_ON_OFF).upper
                elif option == "ACTIVATION":
                    options["activation"] = self._activation(line)
                else:
                    self.expect_op("(")
                    self.expect("STATUS")
                    self.expect_op("=")
                    options["poison_message_handling"] = {"status": self.expect(*_ON_OFF).upper}
                    self.expect_op(")")
                if not self.take_op(",") and not self.at(
                    "STATUS", "RETENTION", "ACTIVATION", "POISON_MESSAGE_HANDLING"
                ):
                    break
        if self.take("ON"):
            if not self.take("DEFAULT"):
                self.name()
            raise NotSupported(
                "CREATE QUEUE ... ON filegroup", "ssb keeps every queue in its one store; omit ON"
            ).at(line)
        return ast.Ddl(line, action, "queue", name, options)

    def _activation(self, line: int) -> dict[str, Any]:
        self.expect_op("(")
        activation: dict[str, Any] = {}
        if self.take("DROP"):
            self.expect_op(")")
            return {"drop": True}
        while True:
            option = self.expect("STATUS", "PROCEDURE_NAME", "MAX_QUEUE_READERS", "EXECUTE").upper
            if option == "EXECUTE":
                self.expect("AS")
                token = self.token
                if self.take("SELF", "OWNER"):
                    activation["execute_as"] = token.upper
                elif token.kind in (Kind.STRING, Kind.NSTRING):
                    self.advance()
                    activation["execute_as"] = str(token.value)
                else:
                    self.fail()
            else:
                self.expect_op("=")
                if option == "STATUS":
                    activation["status"] = self.expect(*_ON_OFF).upper
                elif option == "PROCEDURE_NAME":
                    token = self.token
                    if token.kind in (Kind.STRING, Kind.NSTRING):
                        self.advance()
                        activation["procedure"] = str(token.value)
                    else:
                        activation["procedure"] = self.dotted_name()
                        activation["tsql_procedure"] = True
                else:
                    count = self.advance()
                    if count.kind is not Kind.INTEGER:
                        self.fail(count)
                    activation["max_queue_readers"] = count.value
            if not self.take_op(","):
                break
        self.expect_op(")")
        return activation

    def service(self, line: int, action: str, name: str) -> ast.Statement:
        options: dict[str, Any] = {}
        self._authorization(options)
        if action == "CREATE" or self.at("ON"):
            self.expect("ON")
            self.expect("QUEUE")
            options["queue"] = self.dotted_name()
        if self.take_op("("):
            if action == "CREATE":
                contracts = []
                while True:
                    contracts.append("DEFAULT" if self.take("DEFAULT") else self.dotted_name())
                    if not self.take_op(","):
                        break
                options["contracts"] = contracts
            else:
                add: list[str] = []
                drop: list[str] = []
                while True:
                    which = self.expect("ADD", "DROP").upper
                    self.expect("CONTRACT")
                    contract = "DEFAULT" if self.take("DEFAULT") else self.dotted_name()
                    (add if which == "ADD" else drop).append(contract)
                    if not self.take_op(","):
                        break
                options["add_contracts"] = add
                options["drop_contracts"] = drop
            self.expect_op(")")
        return ast.Ddl(line, action, "service", name, options)

    def route(self, line: int, action: str, name: str) -> ast.Statement:
        options: dict[str, Any] = {}
        self._authorization(options)
        self.expect("WITH")
        while True:
            option = self.expect(
                "SERVICE_NAME", "BROKER_INSTANCE", "LIFETIME", "ADDRESS", "MIRROR_ADDRESS"
            ).upper
            self.expect_op("=")
            options[option.lower()] = self.expression()
            if not self.take_op(","):
                break
        return ast.Ddl(line, action, "route", name, options)

    def broker_priority(self, line: int, action: str, name: str) -> ast.Statement:
        options: dict[str, Any] = {}
        self.expect("FOR")
        self.expect("CONVERSATION")
        if self.take("SET"):
            self.expect_op("(")
            while True:
                option = self.expect(
                    "CONTRACT_NAME", "LOCAL_SERVICE_NAME", "REMOTE_SERVICE_NAME", "PRIORITY_LEVEL"
                ).upper
                self.expect_op("=")
                if self.take("ANY"):
                    value: object = None
                elif option == "PRIORITY_LEVEL" and self.take("DEFAULT"):
                    value = 5
                elif option in ("CONTRACT_NAME", "LOCAL_SERVICE_NAME"):
                    value = self.dotted_name()
                else:
                    value = self.expression()
                options[option.lower()] = value
                if not self.take_op(","):
                    break
            self.expect_op(")")
        return ast.Ddl(line, action, "broker_priority", name, options)

    def event_notification(self, line: int, action: str, name: str) -> ast.Statement:
        options: dict[str, Any] = {}
        while action == "DROP" and self.take_op(","):
            self.dotted_name()
            raise NotSupported(
                "DROP EVENT NOTIFICATION of several names", "drop them one at a time"
            ).at(line)
        self.expect("ON")
        if not self.take("QUEUE"):
            scope = self.expect("SERVER", "DATABASE").upper
            raise NotSupported(
                f"EVENT NOTIFICATION ON {scope}",
                "ssb's event notifications watch one queue: ON QUEUE name FOR QUEUE_ACTIVATION"
                " or BROKER_QUEUE_DISABLED",
            ).at(line)
        options["queue"] = self.dotted_name()
        if action == "DROP":
            return ast.Ddl(line, action, "event_notification", name, options)
        if self.take("WITH"):
            self.expect("FAN_IN")
            raise NotSupported("WITH FAN_IN", "omit it; ssb sends one notification per event").at(
                line
            )
        self.expect("FOR")
        event = self.expect("QUEUE_ACTIVATION", "BROKER_QUEUE_DISABLED").upper
        if self.at_op(","):
            raise NotSupported(
                "an event notification for several events", "create one for each event"
            ).at(line)
        options["event"] = event
        self.expect("TO")
        self.expect("SERVICE")
        options["service"] = self.expression()
        self.expect_op(",")
        options["broker_instance"] = self.expression()
        return ast.Ddl(line, action, "event_notification", name, options)

    def remote_service_binding(self, line: int, action: str, name: str) -> ast.Statement:
        options: dict[str, Any] = {}
        self._authorization(options)
        if action == "CREATE":
            self.expect("TO")
            self.expect("SERVICE")
            options["service"] = self.expression()
        self.expect("WITH")
        while True:
            option = self.expect("USER", "ANONYMOUS").upper
            self.expect_op("=")
            if option == "USER":
                options["user"] = self.dotted_name()
            else:
                options["anonymous"] = self.expect(*_ON_OFF).upper
            if not self.take_op(","):
                break
        return ast.Ddl(line, action, "remote_service_binding", name, options)

    def certificate(self, line: int, action: str, name: str) -> ast.Statement:
        options: dict[str, Any] = {}
        self._authorization(options)
        if action == "CREATE" and self.take("FROM"):
            if self.take("FILE"):
                self.expect_op("=")
                options["file"] = self.expression()
                if not self.at("WITH"):
                    return ast.Ddl(line, action, "certificate", name, options)
            self.fail() if not self.at("WITH") else None
        return self._refused_rest(
            line,
            f"{action} CERTIFICATE with a subject, a private key or a password",
            "ssb makes and keeps its broker's own certificate (see broker_certificate());"
            " CREATE CERTIFICATE name FROM FILE = 'peer.pem' trusts a peer broker's",
        )

    def _authorization(self, options: dict[str, Any]) -> None:
        if self.take("AUTHORIZATION"):
            options["authorization"] = self.dotted_name()

    # ---- what ssb parses and refuses ----------------------------------------------------------

    def _refused_rest(self, line: int, what: str, instead: str) -> ast.Statement:
        """Skip to the end of the statement and refuse it when it runs."""
        self.statement_rest()
        return ast.Refused(line, what, instead)

    def statement_rest(self) -> None:
        """Skip to the end of the statement: the batch's next statement keyword at the
        same parenthesis depth, or `;`."""
        depth = 0
        while not self.at_end:
            token = self.token
            if token.kind.name == "OP":
                if token.text == "(":
                    depth += 1
                elif token.text == ")":
                    depth -= 1
                elif token.text == ";" and depth <= 0:
                    break
            elif (
                depth <= 0
                and token.kind is Kind.NAME
                and token.upper in _STATEMENT_STARTS
                and token is not self.tokens[0]
            ):
                break
            self.advance()


_STATEMENT_STARTS = frozenset(
    [
        "ALTER",
        "BEGIN",
        "BREAK",
        "COMMIT",
        "CONTINUE",
        "CREATE",
        "DECLARE",
        "DROP",
        "END",
        "EXEC",
        "EXECUTE",
        "GET",
        "GO",
        "GRANT",
        "IF",
        "INSERT",
        "MOVE",
        "PRINT",
        "RAISERROR",
        "RECEIVE",
        "RETURN",
        "REVOKE",
        "ROLLBACK",
        "SAVE",
        "SELECT",
        "SEND",
        "SET",
        "THROW",
        "TRUNCATE",
        "UPDATE",
        "USE",
        "WAITFOR",
        "WHILE",
    ]
)


def _text(name: str) -> Any:
    from ._types import SqlType, Value

    return Value(name, SqlType("NVARCHAR", max(1, len(name))))


# the Service Broker objects of CREATE / ALTER / DROP, by their kind's first word: the
# kind (as the client names it), its other words, and what reads the rest of a CREATE or
# ALTER of it
_OBJECTS: Final[
    dict[str, tuple[str, tuple[str, ...], Callable[[BrokerParser, int, str, str], ast.Statement]]]
] = {
    "MESSAGE": ("message_type", ("TYPE",), BrokerParser.message_type),
    "CONTRACT": ("contract", (), BrokerParser.contract),
    "QUEUE": ("queue", (), BrokerParser.queue),
    "SERVICE": ("service", (), BrokerParser.service),
    "ROUTE": ("route", (), BrokerParser.route),
    "BROKER": ("broker_priority", ("PRIORITY",), BrokerParser.broker_priority),
    "EVENT": ("event_notification", ("NOTIFICATION",), BrokerParser.event_notification),
    "REMOTE": (
        "remote_service_binding",
        ("SERVICE", "BINDING"),
        BrokerParser.remote_service_binding,
    ),
    "CERTIFICATE": ("certificate", (), BrokerParser.certificate),
}
