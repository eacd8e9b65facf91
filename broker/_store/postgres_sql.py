"""Users' table statements in PostgreSQL's SQL: `user_sql`'s translation, written for
the PostgreSQL store.

Theory of operation. `user_sql.translate` checks a T-SQL statement and rewrites it for
SQLite; `write` takes that tree (a copy) and writes it for PostgreSQL instead, so both
stores accept and refuse exactly the same statements. What changes:

- Names. Each broker database's tables live in a PostgreSQL schema of their own, `"u:DB"`
  (table `t` of database `sales` is `"u:sales"."t"`): SQLite's one name `"u:sales:t"` is
  split in two. An index is `"t:ix"` in the same schema (SQL Server names an index per
  table, PostgreSQL per schema), a table's identity sequence `"t:identity"`. No name of
  the store's own holds a colon, and a user's name never does. SQL Server's names are
  without case and PostgreSQL's quoted ones are not, so every name of a table, an alias
  or a column is written in lower case; a column declared otherwise keeps its declared
  name in its COMMENT, which names it in the answer to a `*` (`postgres_tables`).
- Temporary tables. SQLite's `"u:tempdb:#work#12"` (session 12's `#work`, see
  `user_sql`) is `"ssb_tempdb"."12#work"`: an ordinary table in a schema of its own, so
  that every connection of the store sees it once its CREATE has committed, as it sees
  the users' tables (the session comes first: PostgreSQL cuts a name longer than 63
  bytes, and two sessions' tables must never meet). No user's database has that
  schema (theirs are all `"u:..."`), so nothing lists these tables as a user's.
- Types. The SQL Server type a column was declared with (SQLite keeps it as its type
  name) becomes PostgreSQL's nearest one; text compares bytewise (`COLLATE "C"`), as
  SQLite's BINARY does. `INT IDENTITY(1,1) PRIMARY KEY` becomes a `bigint GENERATED
  ALWAYS AS IDENTITY` key. Any other type (a cast to `regclass`, say) is refused, and
  so is the store's user (CURRENT_USER: a session's user is its login, not the store's).
- Values. T-SQL's `+` stays `+`: the store defines `+` on two texts and on two byte
  strings (`postgres_schema.OPERATORS`), so it joins them as SQL Server does; `0x01` is a
  `bytea`. Parameters are PostgreSQL's own `$1`, `$2`... (the store binds them with a
  raw cursor: `%` is not special). SUM is the store's `ssb_sum` and AVG its quotient by
  COUNT, of SQL Server's types (`user_kinds`).
"""

from __future__ import annotations

import re
from typing import Final

from sqlglot import exp
from sqlglot.errors import ErrorLevel, SqlglotError

from .._core.ports import TableError
from . import user_kinds, user_sql

IDENTITY: Final = "identity"  # the suffix of a table's identity sequence
MAX_IDENTIFIER: Final = 63  # bytes of a name PostgreSQL keeps (it cuts longer ones)
TEMPORARY_SCHEMA: Final = "ssb_tempdb"  # every session's temporary tables (#name)
_TEXT: Final = 'COLLATE "C"'
_BLOCK: Final = "$ssb_declared$"  # quotes a DO block's body
# SQL Server's type (as `user_sql` keeps it) -> PostgreSQL's (None: the length given)
_TYPES: Final[dict[str, str]] = {
    "INT": "integer",
    "INTEGER": "integer",
    "BIGINT": "bigint",
    "SMALLINT": "smallint",
    "TINYINT": "smallint",
    "BIT": "smallint",
    "DECIMAL": "numeric",
    "NUMERIC": "numeric",
    "MONEY": "numeric(19, 4)",
    "SMALLMONEY": "numeric(10, 4)",
    "FLOAT": "double precision",
    "REAL": "real",
    "CHAR": "varchar",
    "VARCHAR": "varchar",
    "NCHAR": "varchar",
    "NVARCHAR": "varchar",
    "TEXT": "text",
    "NTEXT": "text",
    "XML": "text",
    "DATE": "date",
    "TIME": "time",
    "DATETIME": "timestamp(3)",
    "DATETIME2": "timestamp",
    "SMALLDATETIME": "timestamp(0)",
    "DATETIMEOFFSET": "timestamptz",
    "UNIQUEIDENTIFIER": "uuid",
    "BINARY": "bytea",
    "VARBINARY": "bytea",
    "IMAGE": "bytea",
}
_SIZED: Final = frozenset({"DECIMAL", "NUMERIC", "CHAR", "VARCHAR", "NCHAR", "NVARCHAR"})
_TEXTS: Final = frozenset({"varchar", "text"})
_PLACEHOLDER: Final = re.compile(r"\?(\d+)\Z")
_NAME: Final = re.compile(r"[A-Za-z_@#$][A-Za-z0-9_@#$]*")  # a regular identifier
_TEMPORARY_NAME: Final = re.compile(r"\d+(#.+)")  # see `qualified`
_TINY: Final = frozenset({exp.DataType.Type.TINYINT, exp.DataType.Type.UTINYINT})
# what a cast may name (sqlglot's own types, from T-SQL's names)
_CASTS: Final = frozenset(
    {
        exp.DataType.Type.INT,
        exp.DataType.Type.BIGINT,
        exp.DataType.Type.SMALLINT,
        exp.DataType.Type.TINYINT,
        exp.DataType.Type.UTINYINT,
        exp.DataType.Type.BIT,
        exp.DataType.Type.BOOLEAN,
        exp.DataType.Type.DECIMAL,
        exp.DataType.Type.MONEY,
        exp.DataType.Type.SMALLMONEY,
        exp.DataType.Type.DOUBLE,
        exp.DataType.Type.FLOAT,
        exp.DataType.Type.CHAR,
        exp.DataType.Type.NCHAR,
        exp.DataType.Type.VARCHAR,
        exp.DataType.Type.NVARCHAR,
        exp.DataType.Type.TEXT,
        exp.DataType.Type.XML,
        exp.DataType.Type.DATE,
        exp.DataType.Type.TIME,
        exp.DataType.Type.DATETIME,
        exp.DataType.Type.DATETIME2,
        exp.DataType.Type.SMALLDATETIME,
        exp.DataType.Type.TIMESTAMP,
        exp.DataType.Type.TIMESTAMPTZ,
        exp.DataType.Type.UUID,
        exp.DataType.Type.BINARY,
        exp.DataType.Type.VARBINARY,
        exp.DataType.Type.IMAGE,
    }
)


def schema_name(database: str) -> str:
    """The PostgreSQL schema of a broker database's tables."""
    return f"{user_sql.PREFIX}{database}"


def database_of(schema: str) -> str | None:
    """The broker database of a schema `schema_name` made (None: not one)."""
    if not schema.startswith(user_sql.PREFIX) or ":" in schema[len(user_sql.PREFIX) :]:
        return None
    return schema[len(user_sql.PREFIX) :]


def qualified(database: str, table: str) -> tuple[str, str]:
    """The PostgreSQL schema and name of `table` of `database` (a temporary table,
    `#name#session`, is `session#name` in TEMPORARY_SCHEMA)."""
    if table.startswith("#"):  # (a user's table never begins so, see `user_sql`)
        name, session = table[1:].rsplit("#", 1)
        return TEMPORARY_SCHEMA, f"{session}#{name}"
    return schema_name(database), table


def user_name(name: str) -> str:
    """A PostgreSQL name as the user wrote it (`12#work`, a temporary table's or a name
    PostgreSQL derived from it, is `#work`)."""
    temporary = _TEMPORARY_NAME.fullmatch(name)
    return temporary.group(1) if temporary else name


def sequence_name(database: str, table: str) -> str | None:
    """The qualified, quoted name of `table`'s identity sequence; None where the table
    cannot have one (its name with the suffix is longer than PostgreSQL keeps: such an
    identity column is refused, see `_check_length`)."""
    schema, name = qualified(database, table)
    if len(f"{name}:{IDENTITY}".encode()) > MAX_IDENTIFIER:
        return None
    return _sequence(schema, name)


def _sequence(schema: str, table: str) -> str:
    return f"{_quote(schema)}.{_quote(f'{table}:{IDENTITY}')}"


def _quote(name: str) -> str:
    _check_length(name)
    return '"' + name.replace('"', '""') + '"'


def _check_length(name: str) -> None:
    """PostgreSQL would cut `name` short, and the statement could reach another table,
    index or column than the one written: refuse it.

    Raises:
        TableError: `name` is longer than MAX_IDENTIFIER bytes.
    """
    size = len(name.encode())
    if size <= MAX_IDENTIFIER:
        return
    database = database_of(name)
    if database is not None:
        what = f"the database name {database!r}"
    elif ":" in name:  # (an index's or an identity's name joins its table's)
        table, suffix = name.rsplit(":", 1)
        what = f"the table name {user_name(table)!r} with " + (
            "its identity column" if suffix == IDENTITY else f"its index name {suffix!r}"
        )
    else:
        what = f"the name {user_name(name)!r}"
    raise TableError(
        f"{what} is {size} bytes as the PostgreSQL store names it, and PostgreSQL keeps"
        f" {MAX_IDENTIFIER}: use a shorter name on this store"
    )


def _qualify_update(conflict: exp.OnConflict) -> None:
    """In an upsert's DO UPDATE SET, a bare column is the target row's for SQLite and
    ambiguous (target or EXCLUDED) for PostgreSQL: name the target's table."""
    insert = conflict.find_ancestor(exp.Insert)
    target = insert.this if insert is not None else None
    if isinstance(target, exp.Schema):
        target = target.this
    if not isinstance(target, exp.Table):
        return
    for assignment in conflict.expressions:
        if not isinstance(assignment, exp.EQ):
            continue
        for column in list(assignment.expression.find_all(exp.Column)):  # (itself too)
            if not column.table:
                column.set("table", exp.to_identifier(target.name, quoted=True))


def write(node: exp.Expression) -> str:
    """`user_sql`'s translation of a statement (SQLite's), written for PostgreSQL (see
    the module's comment); `node` is left as it was.

    Raises:
        TableError: a part of it PostgreSQL's store does not take.
    """
    if isinstance(node, exp.Command):
        return _drop_index(node)
    if node.find(exp.CurrentUser, exp.SessionUser) is not None:
        raise user_sql.refused("the store's user (CURRENT_USER, SUSER_NAME())")
    tree = node.copy()
    user_kinds.postgresql(tree)  # (first: its SQLite-only parts name no store table)
    for table in list(tree.find_all(exp.Table)):
        _split(table)
    for index in list(tree.find_all(exp.Index)):
        name = index.this
        if isinstance(name, exp.Identifier) and name.name.startswith(user_sql.PREFIX):
            _, owner, index_name = name.name[len(user_sql.PREFIX) :].split(":")
            index.set("this", exp.to_identifier(f"{owner}:{index_name}", quoted=True))
    for ordered in list(tree.find_all(exp.Ordered)):  # a key's columns are names only
        if ordered.find_ancestor(exp.PrimaryKey, exp.UniqueColumnConstraint) is not None:
            ordered.replace(ordered.this)
    for column in list(tree.find_all(exp.ColumnDef)):
        _column(column, tree)
    for kind in list(tree.find_all(exp.DataType)):
        if kind.find_ancestor(exp.ColumnDef) is not None:
            continue
        if kind.this not in _CASTS:
            raise user_sql.refused(f"the type {kind.sql('tsql').upper()}")
        if kind.this in _TINY:  # (a TINYINT column is a smallint too)
            kind.replace(exp.DataType.build("SMALLINT"))
    for call in list(tree.find_all(exp.Anonymous)):
        if call.name.lower() == user_sql.ADD:
            call.replace(exp.Add(this=call.expressions[0], expression=call.expressions[1]))
    for var in list(tree.find_all(exp.Var)):
        match = _PLACEHOLDER.match(var.name)
        if match:
            var.replace(exp.Var(this=f"${match.group(1)}"))
    for conflict in list(tree.find_all(exp.OnConflict)):
        _qualify_update(conflict)
    for temporary in list(tree.find_all(exp.TemporaryProperty)):
        temporary.pop()  # (an ordinary table, in TEMPORARY_SCHEMA)
    into = tree.args.get("into")
    if isinstance(tree, exp.Select) and into is not None:  # SELECT ... INTO #name
        tree.set("into", None)
        tree = exp.Create(this=into.this, kind="TABLE", expression=tree)
    declared = _declared_names(tree)
    _fold_names(tree)
    for identifier in tree.find_all(exp.Identifier):
        _check_length(identifier.name)
    for hexa in list(tree.find_all(exp.HexString)):
        literal = exp.Literal.string("\\x" + str(hexa.this))
        hexa.replace(exp.Cast(this=literal, to=exp.DataType.build("bytea", dialect="postgres")))
    try:
        sql = tree.sql(dialect="postgres", identify=True, unsupported_level=ErrorLevel.RAISE)
    except SqlglotError as exc:
        raise TableError(f"cannot translate the statement: {exc}") from None
    if not declared:
        return sql
    # one statement (a commit's are pipelined, one command each): a block that runs both
    body = "; ".join([sql, *declared])
    if _BLOCK in body:
        raise TableError(f"{_BLOCK} in a statement that declares columns")
    return f"DO {_BLOCK} BEGIN {body}; END {_BLOCK}"


def _declared_names(tree: exp.Expression) -> list[str]:
    """The COMMENTs that keep the names of the columns a CREATE TABLE or an ALTER TABLE
    ADD declares, where they are not in lower case (`_fold_names` makes them so): a
    `*` names its columns as declared (`postgres_tables`)."""
    if not isinstance(tree, exp.Create | exp.Alter):
        return []
    table = tree.find(exp.Table)
    if table is None or not table.db:
        return []
    names = [column.name for column in tree.find_all(exp.ColumnDef)]
    query = tree.expression
    bound = any(v.name.startswith("$") for v in tree.find_all(exp.Var))
    if isinstance(query, exp.Select) and not bound:  # SELECT ... INTO (a block takes no $n)
        names = [column.alias_or_name for column in query.expressions]
    where = f"{_quote(table.db)}.{_quote(table.name)}"
    return [
        f"COMMENT ON COLUMN {where}.{_quote(name.lower())} IS '{name}'"
        for name in names
        if name != name.lower() and _NAME.fullmatch(name)  # (a regular identifier: no quote)
    ]


def _fold_names(tree: exp.Expression) -> None:
    """Every name of a table, an alias or a column in lower case: SQL Server's names are
    without case, PostgreSQL's quoted ones are not (the tables' own are lower case
    already, `user_sql.store_name`; their schemas keep the database's name as it is).
    The names of the result's columns stay as the query wrote them."""
    shown = _result_names(tree)
    for identifier in tree.find_all(exp.Identifier):
        if id(identifier) in shown:
            continue
        if isinstance(identifier.parent, exp.Table) and identifier.arg_key == "db":
            continue
        identifier.set("this", identifier.name.lower())


def _result_names(tree: exp.Expression) -> set[int]:
    """The identifiers naming the result's columns (by id, see `user_sql`'s
    `_name_results`); an ORDER BY that names one of them is given its spelling."""
    names: dict[str, exp.Identifier] = {}
    for column in user_sql.result_columns(tree):
        if isinstance(column, exp.Alias):
            names.setdefault(column.alias.lower(), column.args["alias"])
    kept = [*names.values()]
    order = tree.args.get("order")
    for ordered in order.expressions if order is not None else []:
        key = ordered.this
        if isinstance(key, exp.Column) and not key.table and key.name.lower() in names:
            kept.append(names[key.name.lower()].copy())
            key.set("this", kept[-1])
    return {id(name) for name in kept}


def _split(table: exp.Table) -> None:
    """SQLite's `"u:DB:t"` as PostgreSQL's `"u:DB"."t"` (see `qualified`)."""
    named = user_sql.shown_name(table.name)
    if named is None:
        return
    schema, name = qualified(*named)
    table.set("this", exp.to_identifier(name, quoted=True))
    table.set("db", exp.to_identifier(schema, quoted=True))


def _column(column: exp.ColumnDef, tree: exp.Expression) -> None:
    """A column as SQLite's translation declared it, declared for PostgreSQL."""
    kind = column.args.get("kind")
    assert isinstance(kind, exp.DataType)
    constraints = column.constraints
    if any(isinstance(c.kind, exp.AutoIncrementColumnConstraint) for c in constraints):
        table = tree.find(exp.Table)
        assert table is not None and table.db
        sequence = _sequence(table.db, table.name)
        column.set(
            "kind",
            exp.DataType(
                this=exp.DataType.Type.USERDEFINED,
                kind=f"bigint GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME {sequence})",
            ),
        )
        column.set(
            "constraints",
            [c for c in constraints if not isinstance(c.kind, exp.AutoIncrementColumnConstraint)],
        )
        return
    for constraint in constraints:
        if constraint.name.startswith(user_kinds.CHECKED) and not user_kinds.for_postgresql(
            constraint
        ):
            constraint.pop()
    declared = str(kind.args.get("kind") or kind.sql("tsql")).upper()
    base = declared.split("(")[0].strip()
    target = _TYPES.get(base)
    if target is None:
        raise user_sql.refused(f"the column type {declared}")
    if base in _SIZED and "(" in declared:
        target += "(" + declared.split("(", 1)[1]
    if target.split("(")[0] in _TEXTS:
        target += f" {_TEXT}"
    column.set("kind", exp.DataType(this=exp.DataType.Type.USERDEFINED, kind=target))


def _drop_index(node: exp.Command) -> str:
    """SQLite's `DROP INDEX [IF EXISTS] "u:DB:t:ix"` for PostgreSQL."""
    text = str(node.expression)
    match = re.fullmatch(r'INDEX( IF EXISTS)? "u:([^:"]+):([^:"]+):([^:"]+)"', text)
    if match is None:
        raise TableError(f"cannot translate the statement: DROP {text}")
    exists, database, table, index = match.groups()
    return f"DROP INDEX{exists or ''} {_quote(schema_name(database))}.{_quote(f'{table}:{index}')}"
