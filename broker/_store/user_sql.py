"""Users' table statements: T-SQL translated to the store's SQL, refused before anything
runs when the translation does not know them.

Theory of operation. `translate` reads one T-SQL statement with sqlglot (read="tsql"),
checks every part of it against what the store can run as SQL Server would, rewrites
it and writes it in the store's dialect (SQLite). What it accepts: CREATE / ALTER (ADD
a column) / DROP TABLE, CREATE / DROP INDEX, INSERT (VALUES, SELECT, OUTPUT inserted.*),
UPDATE (OUTPUT inserted.*), DELETE (OUTPUT deleted.*), SELECT (joins, grouping, TOP,
ORDER BY), SELECT ... INTO #name (CREATE TEMPORARY TABLE ... AS SELECT) and MERGE that
inserts or updates on a key (SQLite's INSERT ... ON CONFLICT, see `_merge`). Anything
else is refused with a `TableError` saying so.

Names. A user's table lives in the namespace of its broker database: table `t` of
database `sales` is SQLite's `"u:sales:t"` (lower case: SQL Server names are without
case), and its indexes `"u:sales:t:index"`. The store's own tables never hold a colon,
so the two can never meet; a name must be a regular identifier (letters, digits, `_`,
`@`, `#`, `$`, not starting with a digit), at most 128 characters, in schema `dbo` of
the session's database. A table named without an alias keeps its own name as alias, so
`t.col` still means its column; a column of the result is named as written (SQLite
names `t.Col` as declared, SQL Server as written). A temporary table `#t` of session 12 is SQLite's TEMP
table `"u:tempdb:#t#12"` (on the writer connection, the only one that runs users'
statements), `#t#12` to the table locks and the transaction.

Values. T-SQL's `+` becomes `ssb_add` (text joins, numbers add; `user_tables`
registers it) outside a table's schema, and N'text' is 'text'. Parameters are `@name`
(`@p1`, `@g`: the client's named or positional values); GETDATE(), SYSDATETIME(), SYSUTCDATETIME(), GETUTCDATE() and NEWID() are evaluated once,
when the statement runs, and bound as parameters: the statement then gives the same
result when the store runs it again at commit (see `user_tables`). Columns keep their
declared SQL Server type as SQLite's type name (it gives the column SQLite's matching
affinity); `INT IDENTITY(1,1) PRIMARY KEY` becomes SQLite's INTEGER PRIMARY KEY
AUTOINCREMENT, whose values never repeat either. SUM and AVG are of their argument's
type, as SQL Server's (`user_kinds.aggregates`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import sqlglot
from sqlglot import exp
from sqlglot.dialects.sqlite import SQLite
from sqlglot.errors import ErrorLevel, SqlglotError

from .._core.ports import TableError
from . import user_kinds

MAX_NAME: Final = 128
ADD: Final = "ssb_add"  # T-SQL's + (see `user_tables.add_functions`)
TRANSLATIONS_KEPT: Final = 1024
MAX_STATEMENT: Final = 256 * 1024  # characters of one statement's text
PREFIX: Final = "u:"
TEMPORARY: Final = "tempdb"  # the database part of temporary tables' SQLite names
_NAME: Final = re.compile(r"[A-Za-z_@#$][A-Za-z0-9_@#$]*\Z")
# functions whose value changes from one evaluation to the next: bound once per statement
VOLATILE: Final = {
    exp.CurrentTimestamp: "now",
    exp.CurrentDatetime: "now",
    exp.UtcTimestamp: "utcnow",
    exp.Uuid: "newid",
}
_VOLATILE_NAMES: Final = {
    "GETDATE": "now",
    "SYSDATETIME": "now",
    "CURRENT_TIMESTAMP": "now",
    "GETUTCDATE": "utcnow",
    "SYSUTCDATETIME": "utcnow",
    "NEWID": "newid",
}
# the functions the translation writes (the stores define them)
_OURS: Final = frozenset({ADD, user_kinds.REPLICATE, user_kinds.UNCONVERTED, user_kinds.INTEGER})
_STATEMENTS: Final = (exp.Select, exp.Union, exp.Insert, exp.Update, exp.Delete)
_REFUSED: Final = {
    exp.Lateral: "APPLY",
}


@dataclass(frozen=True, slots=True)
class Statement:
    """One translated statement.

    Attributes:
        kind: "query" (SELECT), "change" (INSERT / UPDATE / DELETE) or "ddl".
        sql: the store's SQL, its parameters bound by position (`?1`...).
        replay: the same without its OUTPUT, for the run at commit.
        parameters: the names of the parameters it binds, in order (without @, lower
            case; the volatile functions' own ones included).
        volatile: (parameter, function) pairs to evaluate once when it runs ("now",
            "utcnow", "newid").
        reads: the tables it reads, by their names in the database (lower case).
        writes: table -> the permission its change needs (INSERT, UPDATE, DELETE; ALTER
            for an index or ALTER TABLE, DROP for a DROP, CREATE for a new table; a
            MERGE that updates needs "INSERT UPDATE", both).
        returns_rows: a SELECT, or a change with OUTPUT.
        database: the broker database it runs in.
        light: an INSERT ... VALUES without a query: its cost is its rows'.
        values: a light INSERT's VALUES without OUTPUT, as written in `sql` (its end),
            for `inserted_together`.
        counted: a SELECT ... INTO's count of the rows it put in its new table (the
            store's SQL), which it answers as its row count.
        named: the names its result's columns were given, where a `*` gives it others
            too (named as their tables declare them); None: no `*`.
    """

    kind: str
    sql: str
    replay: str
    parameters: tuple[str, ...]
    volatile: tuple[tuple[str, str], ...]
    reads: frozenset[str]
    writes: dict[str, str] = field(hash=False)
    returns_rows: bool
    database: str
    light: bool = False
    values: exp.Values | None = field(default=None, compare=False, repr=False)
    counted: str | None = field(default=None, compare=False, repr=False)
    named: frozenset[str] | None = field(default=None, compare=False, repr=False)

    @property
    def tables(self) -> frozenset[str]:
        """Every table it touches."""
        return self.reads | self.writes.keys()


def refused(what: str, instead: str = "") -> TableError:
    return TableError(f"{what} is not supported by ssb's tables{'; ' + instead if instead else ''}")


def store_name(database: str, table: str) -> str:
    """SQLite's name for `table` of `database`."""
    return f"{PREFIX}{database}:{table.lower()}"


def shown_name(name: str) -> tuple[str, str] | None:
    """(database, table) of a SQLite name `store_name` made (None: not a user's table)."""
    if not name.startswith(PREFIX) or name.count(":") != 2:
        return None
    database, table = name[len(PREFIX) :].split(":")
    return database, table


def _check_name(name: str, what: str) -> str:
    if not name or len(name) > MAX_NAME or not _NAME.match(name):
        raise TableError(
            f"{what} {name[:MAX_NAME]!r} is not a regular identifier (letters, digits, _, @,"
            f" # and $, not starting with a digit, at most {MAX_NAME} characters)"
        )
    if name.startswith("#"):
        raise refused(f"the name {name} in brackets", "write a temporary table's name as #name")
    return name.lower()


def _table_name(table: exp.Table, database: str) -> str:
    """The table's name in the database (lower case), after checking its parts (a
    temporary table's: `_temporary` made it)."""
    if table.this.args.get("temporary"):
        if table.db or table.catalog:
            raise refused(f"a temporary table named with a schema ({table.sql('tsql')})")
        return table.name.lower()
    if table.catalog and table.catalog.lower() != database.lower():
        raise refused(
            f"naming another database's table ({table.catalog}.{table.db}.{table.name})",
            f"USE {table.catalog} first",
        )
    if table.db and table.db.lower() != "dbo":
        if table.db.lower() == "sys":
            raise refused(
                f"the catalog view sys.{table.name} in a statement sent to the broker",
                "T-SQL (ssb sql, procedures) joins tables with the catalog views; from a"
                " program, read the broker's view (view(...)) and join the rows there",
            )
        raise TableError(f"schema {table.db!r} does not exist: tables are in schema dbo")
    if not isinstance(table.this, exp.Identifier):
        raise refused("a table-valued expression in FROM")
    return _check_name(table.name, "table name")


def _rename(table: exp.Table, database: str, *, alias: bool) -> str:
    name = _table_name(table, database)
    if alias and not table.alias:
        table.set("alias", exp.TableAlias(this=exp.to_identifier(table.name, quoted=True)))
    where = TEMPORARY if table.this.args.get("temporary") else database
    table.set("this", exp.to_identifier(store_name(where, name), quoted=True))
    table.set("db", None)
    table.set("catalog", None)
    return name


_TYPES: Final = {
    "INT",
    "INTEGER",
    "BIGINT",
    "SMALLINT",
    "TINYINT",
    "BIT",
    "DECIMAL",
    "NUMERIC",
    "MONEY",
    "SMALLMONEY",
    "FLOAT",
    "REAL",
    "CHAR",
    "VARCHAR",
    "NCHAR",
    "NVARCHAR",
    "TEXT",
    "NTEXT",
    "XML",
    "DATE",
    "TIME",
    "DATETIME",
    "DATETIME2",
    "SMALLDATETIME",
    "DATETIMEOFFSET",
    "UNIQUEIDENTIFIER",
    "BINARY",
    "VARBINARY",
    "IMAGE",
}


_LENGTH_ONE: Final = frozenset({"CHAR", "VARCHAR", "NCHAR", "NVARCHAR", "BINARY", "VARBINARY"})


def _column_type(kind: exp.DataType) -> exp.DataType:
    """The column's SQL Server type, written as SQLite's type name."""
    text = kind.sql("tsql").upper()
    base = text.split("(")[0].strip()
    if base not in _TYPES:
        raise refused(f"the column type {text}")
    if base == "INTEGER":  # (sqlglot writes INT so) SQLite's INTEGER PRIMARY KEY would be
        text = "INT"  # its rowid, numbering a NULL key where SQL Server refuses it
    if base in _LENGTH_ONE and "(" not in text:  # SQL Server's length when none is given
        text += "(1)"
    return exp.DataType(this=exp.DataType.Type.USERDEFINED, kind=re.sub(r"\(\s*MAX\s*\)", "", text))


def _column(column: exp.ColumnDef, keyed: bool = False) -> None:
    """Check a column and write it as SQLite declares it (`keyed`: in the table's
    PRIMARY KEY (...))."""
    _check_name(column.name, "column name")
    column.this.set("quoted", True)
    kind = column.args.get("kind")
    if not isinstance(kind, exp.DataType):
        raise TableError(f"column {column.name} needs a type")
    identity = None
    primary = any(isinstance(c.kind, exp.PrimaryKeyColumnConstraint) for c in column.constraints)
    for constraint in column.constraints:
        what = constraint.kind
        if isinstance(what, exp.GeneratedAsIdentityColumnConstraint):
            identity = what
        elif isinstance(what, exp.NotNullColumnConstraint) and what.args.get("allow_null"):
            if primary or keyed:
                raise TableError(
                    f"Cannot define PRIMARY KEY constraint on nullable column '{column.name}'"
                )
        elif not isinstance(
            what,
            exp.PrimaryKeyColumnConstraint
            | exp.NotNullColumnConstraint
            | exp.DefaultColumnConstraint
            | exp.UniqueColumnConstraint
            | exp.CheckColumnConstraint
            | exp.Reference,
        ):
            raise refused(f"the column constraint {constraint.sql('tsql')}")
    if identity is None:
        declared = _column_type(kind)
        column.set("kind", declared)
        user_kinds.checks(column, str(declared.args["kind"]))
        if (primary or keyed) and not any(
            isinstance(c.kind, exp.NotNullColumnConstraint) for c in column.constraints
        ):  # SQLite lets NULL into a PRIMARY KEY column; SQL Server does not
            column.append("constraints", exp.ColumnConstraint(kind=exp.NotNullColumnConstraint()))
        return
    seed, step = identity.args.get("start"), identity.args.get("increment")
    if (
        not primary
        or kind.this not in (exp.DataType.Type.INT, exp.DataType.Type.BIGINT)
        or any(v is not None and v.sql() != "1" for v in (seed, step))
    ):
        raise refused(
            f"IDENTITY on column {column.name} as declared",
            "declare it INT IDENTITY(1,1) PRIMARY KEY (or BIGINT)",
        )
    column.set("kind", exp.DataType.build("INTEGER"))
    column.set(
        "constraints",
        [
            exp.ColumnConstraint(kind=exp.PrimaryKeyColumnConstraint()),
            exp.ColumnConstraint(kind=exp.AutoIncrementColumnConstraint()),
            *(
                c
                for c in column.constraints
                if not isinstance(
                    c.kind, exp.GeneratedAsIdentityColumnConstraint | exp.PrimaryKeyColumnConstraint
                )
            ),
        ],
    )


def _create(node: exp.Create, database: str, writes: dict[str, str]) -> None:
    kind = node.args.get("kind", "").upper()
    if kind == "TABLE":
        schema = node.this
        if not isinstance(schema, exp.Schema) or not isinstance(schema.this, exp.Table):
            raise refused("CREATE TABLE without a column list (or AS SELECT)")
        if node.expression is not None:
            raise refused("CREATE TABLE ... AS SELECT")
        temporary = schema.this.this.args.get("temporary")
        name = _rename(schema.this, database, alias=False)
        writes[name] = "CREATE"
        keyed = {
            column.name.lower()
            for key in schema.expressions
            if isinstance(key, exp.PrimaryKey)
            for column in key.find_all(exp.Identifier)
        }
        for item in schema.expressions:
            if isinstance(item, exp.ColumnDef):
                _column(item, item.name.lower() in keyed)
            elif not isinstance(
                item, exp.Constraint | exp.PrimaryKey | exp.UniqueColumnConstraint | exp.ForeignKey
            ):
                raise refused(f"{item.sql('tsql')} in CREATE TABLE")
        _references(schema, database, bool(temporary))
        return
    if kind == "INDEX":
        index = node.this
        if not isinstance(index, exp.Index) or not isinstance(index.args.get("table"), exp.Table):
            raise refused("this form of CREATE INDEX")
        if index.args["table"].this.args.get("temporary"):
            raise refused("an index on a temporary table")
        table = _rename(index.args["table"], database, alias=False)
        index_name = _check_name(index.name, "index name")
        index.set("this", exp.to_identifier(f"{store_name(database, table)}:{index_name}", True))
        params = index.args.get("params")
        for part, what in (("include", "INCLUDE"), ("with_storage", "WITH (options)")):
            if params is not None and params.args.get(part):
                raise refused(f"CREATE INDEX ... {what}")
        writes[table] = "ALTER"
        return
    raise refused(f"CREATE {kind or 'this'}")


def _references(node: exp.Expression, database: str, temporary: bool = False) -> None:
    """Name the tables the FOREIGN KEYs in `node` refer to as the store does (a
    `temporary` table's are refused, and so are those to a temporary table)."""
    for reference in node.find_all(exp.Reference):
        referred = reference.find(exp.Table)
        if temporary or referred is None or referred.this.args.get("temporary"):
            raise refused("a FOREIGN KEY on or to a temporary table (#name)")
        _rename(referred, database, alias=False)


def _drop(node: exp.Drop, database: str, writes: dict[str, str]) -> exp.Expression:
    kind = node.args.get("kind", "").upper()
    tables = node.args.get("tables") or []
    if len(tables) != 1 or not isinstance(tables[0], exp.Table):
        raise refused(f"this form of DROP {kind}", f"drop one {kind.lower()} per statement")
    if kind == "TABLE":
        writes[_rename(tables[0], database, alias=False)] = "DROP"
        return node
    if kind == "INDEX":
        # T-SQL's DROP INDEX name ON table
        cluster = node.args.get("cluster")
        table = cluster.this if isinstance(cluster, exp.OnProperty) else None
        if not isinstance(table, exp.Table):
            raise refused("DROP INDEX without ON table", "write DROP INDEX name ON table")
        table_name = _table_name(table, database)
        index_name = _check_name(tables[0].name, "index name")
        writes[table_name] = "ALTER"
        full = f"{store_name(database, table_name)}:{index_name}"
        exists = " IF EXISTS" if node.args.get("exists") else ""
        return exp.Command(this="DROP", expression=f"INDEX{exists} {_quote(full)}")
    raise refused(f"DROP {kind or 'this'}")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _alter(node: exp.Alter, database: str, writes: dict[str, str]) -> None:
    if node.args.get("kind", "").upper() != "TABLE" or not isinstance(node.this, exp.Table):
        raise refused("this ALTER")
    actions = node.args.get("actions") or []
    if len(actions) != 1 or not isinstance(actions[0], exp.ColumnDef):
        raise refused("this ALTER TABLE", "ALTER TABLE ... ADD one column per statement")
    _column(actions[0])
    temporary = node.this.this.args.get("temporary")
    writes[_rename(node.this, database, alias=False)] = "ALTER"
    _references(actions[0], database, bool(temporary))


def _output(node: exp.Expression, allowed: str) -> bool:
    """OUTPUT inserted.* / deleted.* as RETURNING; True when there is one."""
    returning = node.args.get("returning")
    if returning is None:
        return False
    if returning.args.get("into"):
        raise refused("OUTPUT ... INTO")
    for column in list(returning.find_all(exp.Column)):
        table = column.table.lower()
        if table and table != allowed:
            raise refused(
                f"OUTPUT {column.table}.{column.name} here", f"this statement outputs {allowed}.*"
            )
        column.set("table", None)
    return True


def result_columns(node: exp.Expression) -> list[exp.Expression]:
    """The expressions of a statement's result: its (first) SELECT's, or its OUTPUT's."""
    top = node
    while isinstance(top, exp.Union):
        top = top.this
    if isinstance(top, exp.Select):
        return list(top.expressions)
    returning = node.args.get("returning")
    return list(returning.expressions) if returning is not None else []


def _name_results(node: exp.Expression) -> frozenset[str] | None:
    """Name each column of the result that is a table's column as the query wrote it, as
    SQL Server does (SQLite names `t.Col` as its table declares it); the names given
    when a `*` is among them (see `Statement.named`)."""
    names = []
    star = False
    for column in result_columns(node):
        if isinstance(column, exp.Star) or isinstance(column.this, exp.Star):
            star = True
        elif isinstance(column, exp.Column):
            column.replace(exp.alias_(column.copy(), column.this.copy()))
        names.append(column.alias_or_name)
    return frozenset(names) if star else None


def _values(node: exp.Expression) -> tuple[list[str], list[tuple[str, str]]]:
    """Parameters by name, and volatile functions replaced by parameters."""
    volatile: list[tuple[str, str]] = []
    for call in list(node.find_all(exp.Func)):
        if call.find_ancestor(exp.DefaultColumnConstraint) is not None:
            _default(call)
            continue
        function = VOLATILE.get(type(call))
        if function is None and isinstance(call, exp.Anonymous):
            function = _VOLATILE_NAMES.get(call.name.upper())
        if function is None:
            if isinstance(call, exp.Anonymous) and call.name not in _OURS:
                raise refused(f"the function {call.name.upper()}()")
            continue
        name = f"__v{len(volatile)}"
        volatile.append((name, function))
        call.replace(exp.Parameter(this=exp.Var(this=name)))
    for national in list(node.find_all(exp.National)):  # N'text' is SQLite's 'text'
        national.replace(exp.Literal.string(national.this))
    names: list[str] = []
    for parameter in list(node.find_all(exp.Parameter)):
        if isinstance(parameter.parent, exp.Parameter):
            continue  # the inner part of @@name, refused with it
        name = parameter.name.lower()
        if isinstance(parameter.this, exp.Parameter) or name.startswith("@"):
            raise refused(
                f"the system variable @@{name.lstrip('@').upper()}",
                "OUTPUT inserted.* gives new identities",
            )
        if name not in names:
            names.append(name)
        # SQLite's ?NNN: the statement binds its values by position, in `names` order
        parameter.replace(exp.Var(this=f"?{names.index(name) + 1}"))
    return names, volatile


def _default(call: exp.Func) -> None:
    """A function in a column's DEFAULT: a time is SQLite's CURRENT_TIMESTAMP (UTC, taken
    when the row is written, on each run of the statement)."""
    function = VOLATILE.get(type(call)) or _VOLATILE_NAMES.get(call.name.upper())
    if function in ("now", "utcnow"):
        call.replace(exp.CurrentTimestamp())
    elif function is not None or isinstance(call, exp.Anonymous):
        raise refused(f"the function {call.sql('tsql')} in a DEFAULT")


def _sources(
    node: exp.Expression, database: str, reads: set[str], target: exp.Table | None = None
) -> None:
    """Every table a statement reads (all but its `target`), renamed into the database's
    namespace (CTEs by their own names are left alone)."""
    ctes = {cte.alias.lower() for cte in node.find_all(exp.CTE)}
    for table in list(node.find_all(exp.Table)):
        if table is target:
            continue
        if not table.db and not table.catalog and table.name.lower() in ctes:
            continue
        reads.add(_rename(table, database, alias=True))


def _temporary(node: exp.Expr, session: int) -> None:
    """Name each temporary table (#name) after its session, `#name#session` (the name
    SQLite, the table locks and the transaction know it by; a message shows `#name`)."""
    for identifier in node.find_all(exp.Identifier):
        if identifier.args.get("global_"):
            raise refused(f"a global temporary table (##{identifier.name})")
        if identifier.args.get("temporary"):
            name = _check_name(identifier.name, "temporary table name")
            identifier.set("this", f"#{name}#{session}")


Writer = Callable[[exp.Expression], str]  # a translated statement in a store's SQL


@functools.lru_cache(maxsize=TRANSLATIONS_KEPT)
def translate(text: str, database: str, session: int = 0, write: Writer | None = None) -> Statement:
    """One T-SQL statement of session number `session` in `database`, in the store's
    SQL (the last `TRANSLATIONS_KEPT` translations are kept: a program runs the same few
    statements). A temporary table (#name) is the session's own: SQLite's TEMP table on
    the writer connection, which the session drops before it ends. `write` writes the
    translation (SQLite's, as this module describes) in another store's dialect
    (`postgres_sql.write`); it must not change the tree it is given.

    Raises:
        TableError: it cannot be translated, or is not supported (nothing has run).
    """
    if len(text) > MAX_STATEMENT:
        raise TableError(f"a statement has at most {MAX_STATEMENT} characters")
    try:
        parsed = [p for p in sqlglot.parse(text, read="tsql") if p is not None]
    except SqlglotError as exc:
        raise TableError(f"cannot read the statement: {str(exc).splitlines()[0]}") from None
    if len(parsed) != 1:
        raise TableError(f"one statement per call, got {len(parsed)}")
    node = parsed[0]
    for form, what in _REFUSED.items():
        if isinstance(node, form) or node.find(form) is not None:
            raise refused(what)
    if isinstance(node, exp.Command):
        raise refused(f"the statement {node.name.upper()}")
    if isinstance(node, exp.Merge):
        node = _merge(node)
    elif node.find(exp.Merge) is not None:
        raise refused("MERGE here")
    _temporary(node, session)
    writes: dict[str, str] = {}
    reads: set[str] = set()
    returns_rows = False
    made: exp.Expression | None = None  # the table a SELECT ... INTO makes
    if isinstance(node, exp.Create):
        _create(node, database, writes)
        kind = "ddl"
    elif isinstance(node, exp.Drop):
        node = _drop(node, database, writes)
        kind = "ddl"
    elif isinstance(node, exp.Alter):
        _alter(node, database, writes)
        kind = "ddl"
    elif isinstance(node, exp.Select) and node.args.get("into") is not None:
        _select_into(node, database, reads, writes)
        kind = "ddl"
        made = node.args["into"].this
    elif isinstance(node, _STATEMENTS):
        kind, returns_rows = _dml(node, database, reads, writes)
    else:
        raise refused(f"the statement {node.key.upper()}")
    named = _name_results(node) if returns_rows else None
    user_kinds.replicate(node)
    user_kinds.integer_casts(node)
    for cast in node.find_all(exp.Cast):  # (MAX) is the length the stores' text has
        if cast.to.sql("tsql").upper().endswith("(MAX)"):
            cast.to.set("expressions", [])
    if kind != "ddl":  # (a table's schema keeps SQLite's own +: it outlives this process)
        for add in list(node.find_all(exp.Add)):  # T-SQL's + joins text, SQLite's adds
            add.replace(exp.Anonymous(this=ADD, expressions=[add.this, add.expression]))
    names, volatile = _values(node)
    user_kinds.aggregates(node)
    written = write or _written
    sql = written(node)
    counted = (
        None if made is None else written(exp.select(exp.Count(this=exp.Star())).from_(made.copy()))
    )
    replay = sql
    if node.args.get("returning") is not None:
        node.set("returning", None)
        replay = written(node)
    light = (
        isinstance(node, exp.Insert)
        and isinstance(node.expression, exp.Values)
        and node.expression.find(exp.Select) is None
    )
    return Statement(
        kind,
        sql,
        replay,
        tuple(names),
        tuple(volatile),
        frozenset(reads - writes.keys()),
        writes,
        returns_rows,
        database,
        light,
        node.expression if light and replay == sql else None,
        counted,
        named,
    )


@functools.lru_cache(maxsize=TRANSLATIONS_KEPT)
def inserted_together(statement: Statement, runs: int) -> str:
    """The SQL of `runs` runs of a light INSERT (`statement.values`) as one INSERT: its
    VALUES rows once per run, each run's parameters numbered after the previous run's
    (bind the runs' values one run after the other). It inserts what the runs would,
    in the same order, with one statement's cost."""
    values = statement.values
    assert values is not None
    head = statement.sql[: -len(_written(values))]
    width = len(statement.parameters)
    rows: list[exp.Expression] = []
    for run in range(runs):
        copy = values.copy()
        for var in copy.find_all(exp.Var):
            if var.name.startswith("?"):
                var.set("this", f"?{int(var.name[1:]) + run * width}")
        rows += copy.expressions
    return head + _written(exp.Values(expressions=rows))


class _Written(SQLite):
    """SQLite's dialect with `backquoted` names: a double-quoted name SQLite does not
    know becomes a string (SELECT "nope" returns 'nope'); a backquoted one is an error."""

    class Tokenizer(SQLite.Tokenizer):
        IDENTIFIERS = ["`"]


def _written(node: exp.Expression) -> str:
    if isinstance(node, exp.Command):
        return f"{node.name} {node.expression}"
    try:
        return node.sql(dialect=_Written, identify=True, unsupported_level=ErrorLevel.RAISE)
    except SqlglotError as exc:
        raise TableError(f"cannot translate the statement: {exc}") from None


_MERGE_FORM: Final = (
    "the form MERGE target USING source ON target.key = source.column [AND ...] [WHEN"
    " MATCHED THEN UPDATE SET ...] WHEN NOT MATCHED THEN INSERT (columns) VALUES (...),"
    " the keys being the target's primary key or a unique key"
)


def _merge(node: exp.Merge) -> exp.Insert:
    """MERGE as SQLite's upsert, INSERT ... SELECT ... ON CONFLICT (keys) DO UPDATE (or
    DO NOTHING): the same when the ON clause matches the target's key columns to the
    source's columns the INSERT puts in them (SQLite refuses keys that are not a primary
    or unique key's when it runs)."""
    target, source = node.this, node.args.get("using")
    if not isinstance(target, exp.Table) or source is None or not source.alias_or_name:
        raise refused("this MERGE", f"MERGE has {_MERGE_FORM}")
    mine, theirs = target.alias_or_name.lower(), source.alias_or_name.lower()
    update: exp.Update | None = None
    insert: exp.Insert | None = None
    for when in node.args["whens"].expressions:
        then = when.args.get("then")
        if when.args.get("condition") is not None or when.args.get("source"):
            raise refused("WHEN ... AND, or WHEN NOT MATCHED BY SOURCE, in MERGE", _MERGE_FORM)
        if when.args.get("matched") and isinstance(then, exp.Update) and update is None:
            update = then
        elif not when.args.get("matched") and isinstance(then, exp.Insert) and insert is None:
            insert = then
        else:
            what = then.name if isinstance(then, exp.Var) else then.key if then else ""
            raise refused(f"WHEN ... THEN {what.upper()} in MERGE", _MERGE_FORM)
    if (
        insert is None
        or not isinstance(insert.this, exp.Tuple)
        or not isinstance(insert.expression, exp.Tuple)
        or node.args.get("returning") is not None
    ):
        raise refused("this MERGE", f"MERGE has {_MERGE_FORM}")
    columns = [c.name.lower() for c in insert.this.expressions]
    values = insert.expression.expressions
    # the target's column each source column goes into
    into = {
        v.name.lower(): c
        for c, v in zip(columns, values, strict=False)
        if isinstance(v, exp.Column) and v.table.lower() == theirs
    }
    keys = []
    condition = node.args.get("on")
    if condition is None:
        raise refused("MERGE without ON", _MERGE_FORM)
    for pair in condition.flatten() if isinstance(condition, exp.And) else [condition]:
        if not isinstance(pair, exp.EQ) or not all(
            isinstance(side, exp.Column) for side in (pair.this, pair.expression)
        ):
            raise refused(f"the ON clause {condition.sql('tsql')} of MERGE", _MERGE_FORM)
        key, value = sorted((pair.this, pair.expression), key=lambda c: c.table.lower() != mine)
        if key.table.lower() != mine or into.get(value.name.lower()) != key.name.lower():
            raise refused(f"the ON clause {condition.sql('tsql')} of MERGE", _MERGE_FORM)
        keys.append(exp.column(key.name))
    changes = []
    for change in update.expressions if update is not None else []:
        for column in list(change.find_all(exp.Column)):
            table = column.table.lower()
            if table == theirs and column.name.lower() in into:
                column.replace(exp.column(into[column.name.lower()], "excluded"))
            elif table == theirs:
                raise refused(
                    f"{column.sql('tsql')} in MERGE's UPDATE",
                    "its UPDATE reads the source's columns its INSERT inserts",
                )
            elif table in (mine, ""):
                column.set("table", None)
        changes.append(change)
    if isinstance(source, exp.Values):  # (SQLite names no columns in an alias)
        source = _named_rows(source)
    rows = exp.select(*values).from_(source).where(exp.true())
    target.set("alias", None)
    return exp.Insert(
        this=exp.Schema(this=target, expressions=insert.this.expressions),
        expression=rows,
        conflict=exp.OnConflict(
            conflict_keys=keys,
            action=exp.var("DO UPDATE" if changes else "DO NOTHING"),
            expressions=changes,
        ),
    )


def _named_rows(values: exp.Values) -> exp.Subquery:
    """`(VALUES (...), ...) AS s (a, b)` as `(SELECT ... AS a, ... AS b UNION ALL ...) AS s`."""
    alias = values.args["alias"]
    names = [column.name for column in alias.columns]
    selects = [
        exp.select(*(exp.alias_(v, n) for v, n in zip(row.expressions, names, strict=False)))
        for row in values.expressions
    ]
    union: exp.Expression = selects[0]
    for select in selects[1:]:
        union = exp.union(union, select, distinct=False)
    return exp.Subquery(this=union, alias=exp.TableAlias(this=alias.this))


def _select_into(node: exp.Select, database: str, reads: set[str], writes: dict[str, str]) -> None:
    """SELECT ... INTO #name: SQLite's CREATE TEMPORARY TABLE ... AS SELECT."""
    into = node.args["into"]
    if not isinstance(into.this, exp.Table) or not into.this.this.args.get("temporary"):
        raise refused(
            "SELECT ... INTO a table",
            "SELECT ... INTO #name, or CREATE TABLE then INSERT ... SELECT",
        )
    if node.find_ancestor(exp.Union) is not None or node.parent is not None:
        raise refused("SELECT ... INTO here")
    if any(s is not node and s.args.get("into") for s in node.find_all(exp.Select)):
        raise refused("SELECT ... INTO in a subquery")
    writes[_rename(into.this, database, alias=False)] = "CREATE"
    _sources(node, database, reads, into.this)


def _dml(
    node: exp.Expression, database: str, reads: set[str], writes: dict[str, str]
) -> tuple[str, bool]:
    if isinstance(node, exp.Select | exp.Union):
        for select in node.find_all(exp.Select):
            if any(
                isinstance(e, exp.EQ) and isinstance(e.this, exp.Parameter)
                for e in select.expressions
            ):
                raise refused("SELECT @variable = ... on the broker", "the T-SQL session assigns")
        _sources(node, database, reads)
        return "query", True
    target = node.this
    if isinstance(target, exp.Schema):
        target = target.this
    if not isinstance(target, exp.Table):
        raise refused(f"this form of {node.key.upper()}")
    if isinstance(node, exp.Insert):
        verb, output = "INSERT", "inserted"
        conflict = node.args.get("conflict")  # (a MERGE's, see `_merge`)
        if conflict is not None and conflict.args.get("expressions"):
            verb = "INSERT UPDATE"
    elif isinstance(node, exp.Update):
        verb, output = "UPDATE", "inserted"
        if node.args.get("from") or node.args.get("from_"):
            raise refused("UPDATE ... FROM", "use a subquery in SET or WHERE")
    else:
        verb, output = "DELETE", "deleted"
        if node.args.get("using"):
            raise refused("DELETE ... FROM a join", "use a subquery in WHERE")
    name = _rename(target, database, alias=not isinstance(node, exp.Insert))
    returns_rows = _output(node, output)
    _sources(node, database, reads, target)
    writes[name] = verb
    reads.discard(name)
    return "change", returns_rows
