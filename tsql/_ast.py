"""The syntax tree of a batch: statements and expressions, as the parser builds them.

Nodes are frozen where nothing changes after parsing; a `Select` keeps a slot for the
translation of its query (made once, the first time it runs, then reused by every loop
iteration and every later call of the procedure that holds it). Every statement knows
its line in the file, which errors report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._types import SqlType, Value

# ---- expressions -----------------------------------------------------------------


class Expr:
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Literal(Expr):
    value: Value


@dataclass(frozen=True, slots=True)
class Variable(Expr):
    name: str  # as written, e.g. @RecvReqMsg
    key: str  # upper case: variables are found without case


@dataclass(frozen=True, slots=True)
class SystemFunction(Expr):
    name: str  # upper case, e.g. @@ROWCOUNT


@dataclass(frozen=True, slots=True)
class Column(Expr):
    parts: tuple[str, ...]  # [table.]column

    @property
    def name(self) -> str:
        return self.parts[-1]


@dataclass(frozen=True, slots=True)
class Star(Expr):
    qualifier: str | None = None


@dataclass(frozen=True, slots=True)
class Unary(Expr):
    op: str  # -, +, ~, NOT
    operand: Expr


@dataclass(frozen=True, slots=True)
class Binary(Expr):
    op: str  # + - * / % & | ^ = <> < > <= >= AND OR
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class IsNull(Expr):
    operand: Expr
    negated: bool


@dataclass(frozen=True, slots=True)
class Between(Expr):
    operand: Expr
    low: Expr
    high: Expr
    negated: bool


@dataclass(frozen=True, slots=True)
class InList(Expr):
    operand: Expr
    items: tuple[Expr, ...]
    negated: bool


@dataclass(frozen=True, slots=True)
class InQuery(Expr):
    operand: Expr
    query: Select
    negated: bool


@dataclass(frozen=True, slots=True)
class Like(Expr):
    operand: Expr
    pattern: Expr
    escape: Expr | None
    negated: bool


@dataclass(frozen=True, slots=True)
class Case(Expr):
    operand: Expr | None
    whens: tuple[tuple[Expr, Expr], ...]
    default: Expr | None


@dataclass(frozen=True, slots=True)
class Cast(Expr):
    operand: Expr
    type: SqlType
    style: Expr | None = None
    safe: bool = False  # TRY_CAST / TRY_CONVERT: NULL instead of an error


@dataclass(frozen=True, slots=True)
class Call(Expr):
    name: str  # upper case
    args: tuple[Expr, ...]
    line: int = 0


@dataclass(frozen=True, slots=True)
class Method(Expr):
    target: Expr
    name: str  # lower case: value, query, exist, nodes, modify
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Exists(Expr):
    query: Select


@dataclass(frozen=True, slots=True)
class Subquery(Expr):
    query: Select


# ---- queries ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SelectItem:
    expr: Expr
    alias: str | None
    target: str | None = None  # @v in SELECT @v = expr (upper-case key)
    target_name: str | None = None
    op: str = "="  # or += -= ... for SELECT @v += expr
    start: int = 0  # the expression's text in the batch
    end: int = 0


@dataclass(slots=True)
class Select:
    """A SELECT (or a query a statement holds). `text` is its source, for the SQL engine
    when it reads views or queues; `sql` caches its translation."""

    items: tuple[SelectItem, ...]
    has_from: bool
    text: str
    items_start: int  # offsets of the select list within `text`
    items_end: int
    top: Expr | None = None
    distinct: bool = False
    into: str | None = None
    line: int = 0
    offset: int = 0  # where `text` starts in the batch (item offsets are the batch's)
    sql: Any = None  # the translation, once made (see _query)

    @property
    def assigns(self) -> bool:
        return any(item.target is not None for item in self.items)


# ---- statements ---------------------------------------------------------------------


@dataclass(slots=True)
class Statement:
    line: int


@dataclass(frozen=True, slots=True)
class TableConstraints:
    """What a table variable's declaration holds its rows to: the columns (positions)
    that take no NULL, its PRIMARY KEY's and its UNIQUE column sets."""

    not_null: frozenset[int] = frozenset()
    primary: tuple[int, ...] = ()
    unique: tuple[tuple[int, ...], ...] = ()


NO_CONSTRAINTS = TableConstraints()


@dataclass(slots=True)
class DeclareItem:
    name: str
    key: str
    type: SqlType | None  # None: a table variable (columns below)
    init: Expr | None = None
    columns: tuple[tuple[str, SqlType], ...] = ()
    constraints: TableConstraints = NO_CONSTRAINTS


@dataclass(slots=True)
class Declare(Statement):
    items: list[DeclareItem]


@dataclass(slots=True)
class SetVariable(Statement):
    name: str
    key: str
    op: str  # = += -= *= /= %= &= |= ^=
    expr: Expr


@dataclass(slots=True)
class SetOption(Statement):
    option: str  # upper case, e.g. NOCOUNT, PARSEONLY, XACT_ABORT
    value: str  # ON / OFF or the value as written


@dataclass(slots=True)
class SelectStatement(Statement):
    query: Select


@dataclass(slots=True)
class Block(Statement):
    body: list[Statement]


@dataclass(slots=True)
class If(Statement):
    condition: Expr
    then: Statement
    otherwise: Statement | None


@dataclass(slots=True)
class While(Statement):
    condition: Expr
    body: Statement


@dataclass(slots=True)
class Break(Statement):
    pass


@dataclass(slots=True)
class Continue(Statement):
    pass


@dataclass(slots=True)
class TryCatch(Statement):
    body: list[Statement]
    handler: list[Statement]


@dataclass(slots=True)
class Transaction(Statement):
    action: str  # BEGIN, COMMIT, ROLLBACK, SAVE
    name: str | None = None


@dataclass(slots=True)
class Print(Statement):
    expr: Expr


@dataclass(slots=True)
class RaiseError(Statement):
    message: Expr
    severity: Expr
    state: Expr
    args: list[Expr]
    options: list[str]


@dataclass(slots=True)
class Throw(Statement):
    number: Expr | None = None  # None: rethrow in a CATCH block
    message: Expr | None = None
    state: Expr | None = None


@dataclass(slots=True)
class Return(Statement):
    expr: Expr | None


@dataclass(slots=True)
class WaitforDelay(Statement):
    delay: Expr
    until: bool  # WAITFOR TIME (until) or WAITFOR DELAY


@dataclass(slots=True)
class Argument:
    name: str | None  # @param = value (upper-case key)
    expr: Expr | None  # None: DEFAULT
    output: bool = False
    written: str = ""  # the @param as the call writes it


@dataclass(slots=True)
class Execute(Statement):
    procedure: str
    arguments: list[Argument]
    result: str | None = None  # @rc in EXEC @rc = proc


@dataclass(slots=True)
class Parameter:
    name: str
    key: str
    type: SqlType
    default: Expr | None
    output: bool


@dataclass(slots=True)
class CreateProcedure(Statement):
    name: str
    parameters: list[Parameter]
    body: list[Statement]
    text: str
    alter: bool = False
    or_alter: bool = False
    execute_as: str | None = None  # WITH EXECUTE AS: CALLER, SELF, OWNER or a user


@dataclass(slots=True)
class DropProcedure(Statement):
    names: list[str]
    if_exists: bool


@dataclass(slots=True)
class Use(Statement):
    database: str


@dataclass(slots=True)
class Database(Statement):
    """CREATE / DROP / ALTER DATABASE: `options` holds what ALTER ... SET names."""

    action: str
    name: str
    options: dict[str, str] = field(default_factory=dict)
    if_exists: bool = False


@dataclass(slots=True)
class Ddl(Statement):
    """A Service Broker CREATE / ALTER / DROP: `kind` is the object's kind as the
    client names it (message_type, contract, queue, service, route, broker_priority,
    event_notification, remote_service_binding, certificate); `options` what it says."""

    action: str
    kind: str
    name: str
    options: dict[str, Any] = field(default_factory=dict)
    if_exists: bool = False


@dataclass(slots=True)
class TableChange(Statement):
    """INSERT, UPDATE or DELETE of a table variable, run on the SQL engine from its text
    (`sql` caches the translation)."""

    action: str
    variable: str  # the table variable's key
    text: str
    sql: Any = None


@dataclass(slots=True)
class TableStatement(Statement):
    """A statement on the broker's tables (CREATE / ALTER / DROP TABLE or INDEX, INSERT,
    UPDATE, DELETE of a table): sent to the broker as written, with the values of the
    variables it names."""

    text: str
    variables: tuple[str, ...]  # the keys of the variables it names
    creates: str | None = None  # the temporary table (#name) a CREATE TABLE makes


@dataclass(slots=True)
class Refused(Statement):
    """A statement ssb parses but does not run (CREATE MASTER KEY, CREATE ENDPOINT...):
    running it raises NotSupported with what to do instead."""

    what: str
    instead: str


# ---- conversations -------------------------------------------------------------------


@dataclass(slots=True)
class BeginDialog(Statement):
    handle: str  # the variable that gets it (upper-case key)
    handle_name: str
    from_service: Expr
    to_service: Expr
    broker_instance: Expr | None
    contract: Expr | None
    related_conversation: Expr | None = None
    related_group: Expr | None = None
    lifetime: Expr | None = None
    encryption: bool | None = None


@dataclass(slots=True)
class Send(Statement):
    handles: list[Expr]
    message_type: Expr | None
    body: Expr | None


@dataclass(slots=True)
class Receive(Statement):
    """RECEIVE [TOP (n)] columns FROM queue [INTO @table] [WHERE ...], or GET
    CONVERSATION GROUP @g FROM queue; `timeout` set when WAITFOR wraps it (None inside
    WAITFOR without TIMEOUT: wait forever)."""

    queue: str
    items: tuple[SelectItem, ...]
    top: Expr | None = None
    into: str | None = None
    where_column: str | None = None  # conversation_handle / conversation_group_id
    where_value: Expr | None = None
    waitfor: bool = False
    timeout: Expr | None = None
    group_variable: str | None = None  # GET CONVERSATION GROUP @g
    group_variable_name: str | None = None


@dataclass(slots=True)
class EndConversation(Statement):
    handle: Expr
    error: Expr | None = None
    description: Expr | None = None
    cleanup: bool = False


@dataclass(slots=True)
class ConversationTimer(Statement):
    handle: Expr
    timeout: Expr


@dataclass(slots=True)
class MoveConversation(Statement):
    handle: Expr
    group: Expr
