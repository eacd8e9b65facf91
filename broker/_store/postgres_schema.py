"""The PostgreSQL database: its tables and indexes, and how a new one is made.

Theory of operation. The tables are SQLite's (`schema`), column for column, so that the
families of tables run the same SQL on both: a UUID is `bytea` (16 bytes, compared
bytewise as SQLite compares blobs), a time `double precision`, a boolean a `smallint`
(0 or 1), and every text column sorts bytewise (`COLLATE "C"`, SQLite's BINARY) whatever
the database's locale. A message's and an outcome record's count of bytes or ids is an
`integer`, so that their sums are `bigint`s, which the driver reads as ints.

Beside them: `ssb_schema` holds the schema version (1 was the first layout, 2 adds the
lease, 3 keeps users' column names in lower case, their declared names in the columns'
comments: an older database's are so renamed; a database written by a newer ssb is
refused, left as it is), and `commit_marks`
one row whose token every commit rewrites in its own transaction, so that a commit whose
answer was lost with the connection can be settled afterwards by reading the token back
(see `postgres`). `broker_lease` is one row, the lease that says which of the daemons
sharing the database serves, `broker_nodes` one row per daemon that has used it, and
the function `ssb_fence(epoch)`, the first statement of every commit, fails the commit
of a daemon whose lease has passed to another (see `lease`).

`create` makes what is missing in one transaction, under an advisory lock, so that
daemons started together on a new database make one schema (an older schema is brought
up to date there); `make_identity` gives the broker its instance id (in `meta`) unless it
has one. The identity lives in the database, not in the data directory (the instance id
here, the files a first start makes in `broker_files`), so that every daemon given the
same database is the same broker.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any, Final

from . import sql, user_kinds
from .errors import LEASE_LOST_STATE, StoreUnavailable

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("ssb.store")

SCHEMA_VERSION: Final = 3
BROKER_INSTANCE: Final = "broker_instance"  # the meta key of the broker's instance id
# the advisory locks (64-bit keys): held while the schema is made or upgraded, and by
# the lease session of the daemon that serves (see `lease`)
SCHEMA_LOCK: Final = 0x5353_4253_4348_454D  # "SSBSCHEM"
BROKER_LOCK: Final = 0x5353_4242_524F_4B52  # "SSBBROKR"

_TEXT: Final = 'text COLLATE "C"'
_UUID: Final = "bytea"
_TIME: Final = "double precision"
TABLES: Final = (
    "CREATE TABLE IF NOT EXISTS ssb_schema (version integer NOT NULL)",
    "CREATE TABLE IF NOT EXISTS commit_marks ( id integer PRIMARY KEY, token bytea NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS meta (key {_TEXT} PRIMARY KEY, value text NOT NULL)",
    "CREATE TABLE IF NOT EXISTS catalog ("
    f" kind {_TEXT} NOT NULL, name {_TEXT} NOT NULL, body text NOT NULL,"
    " PRIMARY KEY (kind, name))",
    "CREATE TABLE IF NOT EXISTS endpoints ("
    f" handle {_UUID} NOT NULL, conversation_id {_UUID} NOT NULL,"
    f" is_initiator smallint NOT NULL, service {_TEXT} NOT NULL,"
    f" far_service {_TEXT} NOT NULL, far_broker_instance {_TEXT},"
    f" contract {_TEXT} NOT NULL, group_id {_UUID} NOT NULL, state {_TEXT} NOT NULL,"
    " send_seq bigint NOT NULL, receive_seq bigint NOT NULL, priority integer NOT NULL,"
    f" lifetime_expiry {_TIME}, timer_at {_TIME}, far_handle {_UUID},"
    f" created {_TIME} NOT NULL, extra bytea, PRIMARY KEY (conversation_id, is_initiator))",
    "CREATE TABLE IF NOT EXISTS messages ("
    f" queuing_order bigint PRIMARY KEY, queue {_TEXT} NOT NULL, handle {_UUID} NOT NULL,"
    f" seq bigint NOT NULL, message_type {_TEXT} NOT NULL, validation {_TEXT} NOT NULL,"
    f" body bytea NOT NULL, enqueue_time {_TIME} NOT NULL, status smallint NOT NULL,"
    " delivery_count integer NOT NULL, extra bytea, size integer NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS transmission_queue ("
    f" id bigint PRIMARY KEY, handle {_UUID} NOT NULL, conversation_id {_UUID} NOT NULL,"
    f" to_service {_TEXT} NOT NULL, to_broker_instance {_TEXT},"
    f" from_service {_TEXT} NOT NULL, contract {_TEXT} NOT NULL,"
    " is_initiator smallint NOT NULL, seq bigint NOT NULL,"
    f" message_type {_TEXT} NOT NULL, validation {_TEXT} NOT NULL, body bytea NOT NULL,"
    f" enqueue_time {_TIME} NOT NULL, priority integer NOT NULL, status {_TEXT} NOT NULL,"
    " extra bytea)",
    "CREATE TABLE IF NOT EXISTS remote_dialogs ("
    f" conversation_id {_UUID} NOT NULL, direction integer NOT NULL, side {_TEXT} NOT NULL,"
    f" peer {_TEXT} NOT NULL, session_key bytea, wrapped_key bytea,"
    " next_seq bigint NOT NULL, envelope bytea,"
    " PRIMARY KEY (conversation_id, direction, side))",
    "CREATE TABLE IF NOT EXISTS held_fragments ("
    f" conversation_id {_UUID} NOT NULL, direction integer NOT NULL, seq bigint NOT NULL,"
    " fragment_index integer NOT NULL, fragment_count integer NOT NULL,"
    f" message_type {_TEXT} NOT NULL, payload bytea NOT NULL,"
    " PRIMARY KEY (conversation_id, direction, seq, fragment_index))",
    "CREATE TABLE IF NOT EXISTS poison_messages ("
    f" id bigint PRIMARY KEY, queue {_TEXT} NOT NULL, handle {_UUID},"
    " queuing_order bigint, delivery_count integer,"
    f" action {_TEXT} NOT NULL, time {_TIME} NOT NULL, error text NOT NULL, body bytea)",
    "CREATE TABLE IF NOT EXISTS logins ("
    f" name {_TEXT} PRIMARY KEY, hash text NOT NULL, created {_TIME} NOT NULL)",
    "CREATE TABLE IF NOT EXISTS grants ("
    f" login {_TEXT} NOT NULL, permission {_TEXT} NOT NULL, kind {_TEXT} NOT NULL,"
    f" name {_TEXT} NOT NULL, PRIMARY KEY (login, permission, kind, name))",
    "CREATE TABLE IF NOT EXISTS owners ("
    f" kind {_TEXT} NOT NULL, name {_TEXT} NOT NULL, login {_TEXT} NOT NULL,"
    " PRIMARY KEY (kind, name))",
    "CREATE TABLE IF NOT EXISTS execution_log ("
    f" log_id bigint PRIMARY KEY, caller bigint, scheduler_handle {_UUID},"
    f" task text NOT NULL, queued_time {_TIME} NOT NULL, start_time {_TIME},"
    f" end_time {_TIME}, activated_task bigint, pid bigint, session_id bigint, error text)",
    "CREATE TABLE IF NOT EXISTS outcome_batches ("
    f" seq bigint PRIMARY KEY, time {_TIME} NOT NULL, count integer NOT NULL,"
    " ids bytea NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS broker_files (name {_TEXT} PRIMARY KEY, body text NOT NULL)",
    # the lease: times are the server's (every daemon judges them by one clock)
    "CREATE TABLE IF NOT EXISTS broker_lease ("
    " id integer PRIMARY KEY CHECK (id = 1), epoch bigint NOT NULL,"
    f" holder {_TEXT} NOT NULL, expires timestamptz NOT NULL,"
    " renewed timestamptz NOT NULL, taken timestamptz NOT NULL)",
    "CREATE TABLE IF NOT EXISTS broker_nodes ("
    f" node {_TEXT} PRIMARY KEY, name text NOT NULL, role {_TEXT} NOT NULL,"
    " pid integer NOT NULL, address text NOT NULL, started timestamptz NOT NULL,"
    " seen timestamptz NOT NULL)",
)
# made with the schema and with each upgrade (a daemon that only uses the database need
# not own them)
FUNCTIONS: Final = (
    # the first statement of every commit: it holds the lease row (KEY SHARE, which a
    # takeover's FOR UPDATE waits for) and fails unless the lease is still `held`
    "CREATE OR REPLACE FUNCTION ssb_fence(held bigint) RETURNS void LANGUAGE plpgsql AS $$"
    " BEGIN"
    " PERFORM 1 FROM broker_lease WHERE id = 1 AND epoch = held FOR KEY SHARE;"
    " IF NOT FOUND THEN RAISE EXCEPTION USING ERRCODE = '" + LEASE_LOST_STATE + "',"
    " MESSAGE = 'the broker lease has passed to another daemon: this daemon may not"
    " commit';"
    " END IF;"
    " END $$",
)
# T-SQL's + on two texts or two byte strings joins them (users' table statements keep
# their +, see `postgres_sql`); made where missing at every start, by a user who may (for
# one who may not, + of texts fails until a start as one who may)
OPERATORS: Final = tuple(
    "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_operator WHERE oprname = '+'"
    f" AND oprleft = '{kind}'::regtype AND oprright = '{kind}'::regtype) THEN"
    f" CREATE OPERATOR + (LEFTARG = {kind}, RIGHTARG = {kind}, FUNCTION = {function});"
    " END IF; EXCEPTION WHEN insufficient_privilege THEN NULL; END $$"
    for kind, function in (("text", "textcat"), ("bytea", "byteacat"))
)
# SUM of users' table statements as SQL Server's, of its argument's type (see
# `user_kinds`): of SMALLINT or INT an INT, which fails past INT's range, of BIGINT a
# BIGINT, of the others their own type; made where missing at every start, as OPERATORS.
# AVG's sum is the same aggregate by another name (a type neither takes fails naming it)
_SUMS: Final = (
    "(smallint) (SFUNC = int2_sum, STYPE = bigint, FINALFUNC = ssb_int_total)",
    "(integer) (SFUNC = int4_sum, STYPE = bigint, FINALFUNC = ssb_int_total)",
    "(bigint) (SFUNC = int8pl, STYPE = bigint)",
    "(numeric) (SFUNC = numeric_add, STYPE = numeric)",
    "(real) (SFUNC = float4pl, STYPE = real)",
    "(double precision) (SFUNC = float8pl, STYPE = double precision)",
)
AGGREGATES: Final = (
    "DO $$ BEGIN IF to_regprocedure('ssb_sum(integer)') IS NULL THEN"
    " CREATE FUNCTION ssb_int_total(bigint) RETURNS integer LANGUAGE sql IMMUTABLE"
    " AS 'SELECT CAST($1 AS integer)';"
    + "".join(f" CREATE AGGREGATE ssb_sum{form};" for form in _SUMS)
    + " END IF; EXCEPTION WHEN insufficient_privilege THEN NULL; END $$",
    "DO $$ BEGIN IF to_regprocedure('ssb_avg_sum(integer)') IS NULL THEN"
    + "".join(f" CREATE AGGREGATE ssb_avg_sum{form};" for form in _SUMS)
    + " END IF; EXCEPTION WHEN insufficient_privilege THEN NULL; END $$",
)
# T-SQL's REPLICATE, as `user_kinds.replicate` writes it; made where missing at every
# start, as OPERATORS
REPLICATE: Final = (
    "DO $$ BEGIN IF to_regprocedure('ssb_replicate(text, bigint, integer)') IS NULL THEN"
    " CREATE FUNCTION ssb_replicate(value text, times bigint, room integer) RETURNS text"
    " LANGUAGE plpgsql IMMUTABLE AS $f$ BEGIN"
    " IF value IS NULL OR times IS NULL OR times < 0 THEN RETURN NULL; END IF;"
    " IF room IS NOT NULL THEN"
    " RETURN left(repeat(value, least(times, room / greatest(length(value), 1) + 1)::integer),"
    " room); END IF;"
    f" IF octet_length(value)::numeric * times > {user_kinds.LONGEST} THEN"
    f" RAISE EXCEPTION '{user_kinds.grown()}'; END IF;"
    " RETURN repeat(value, times::integer); END $f$;"
    " END IF; EXCEPTION WHEN insufficient_privilege THEN NULL; END $$",
)


def _raised(message: str, *values: str) -> str:
    """A RAISE of `message`, a template whose %1$s, %2$s... are `values` (SQL)."""
    template = message.replace("'", "''")
    if not values:
        return f"RAISE EXCEPTION '%', '{template}';"
    return f"RAISE EXCEPTION '%', format('{template}', {', '.join(values)});"


def _unfit() -> str:
    """The CREATE of `ssb_unfit(value, type, source, safe)`, which fails as
    `user_kinds.unfit` words it (as `user_kinds.conversion_failed`, of text that is no
    whole number), or gives NULL where `safe`."""
    texts = "".join(
        f" IF kind = '{kind}' THEN {_raised(user_kinds.unfit('%1$s', kind, 'varchar'), 'value')}"
        " END IF;"
        for kind in user_kinds.INTEGER_KINDS
    )
    low, high = user_kinds.INTEGER_RANGES["INT"]
    narrow = "".join(
        f" IF kind = '{kind}' AND source = 'int' AND value::numeric BETWEEN {low} AND {high}"
        f" THEN {_raised(user_kinds.number_overflowed('%1$s', kind), 'value')} END IF;"
        for kind in ("TINYINT", "SMALLINT")
    )
    numbers = "".join(
        f" IF kind = '{kind}' THEN {_raised(user_kinds.overflow(kind))} END IF;"
        for kind in user_kinds.INTEGER_KINDS
    )
    unconverted = _raised(user_kinds.conversion_failed("%1$s", "%2$s"), "value", "lower(kind)")
    return (
        f" CREATE FUNCTION {user_kinds.UNFIT}(value text, kind text, source text, safe boolean)"
        " RETURNS numeric LANGUAGE plpgsql STABLE AS $f$ BEGIN IF safe THEN RETURN NULL; END IF;"
        f" IF source = 'varchar' AND value !~ '{user_kinds.WHOLE_TEXT}' THEN {unconverted}"
        f" END IF; IF source = 'varchar' THEN {texts} END IF;{narrow}{numbers}"
        " RETURN NULL; END $f$;"
    )


_TRIMMED: Final = "CAST(coalesce(nullif(btrim($1, '' ''), ''''), ''0'') AS numeric)"
# (the type, its whole number, `unfit`'s source; a real is taken as a double precision)
_WHOLES: Final = (
    ("smallint", "$1", "int"),
    ("integer", "$1", "int"),
    ("bigint", "$1", "int"),
    ("numeric", "trunc($1)", "numeric"),
    ("double precision", "trunc($1)", "float"),
)
# a cast to an integer type as `user_kinds.integer_casts` writes it, `ssb_whole(value,
# type, low, high, safe)`: the whole number of the value, a number cut toward zero
# (PostgreSQL's CAST rounds it), text of a whole number converted (of no digits at all,
# 0: PostgreSQL's CAST refuses it), or, past the range or of text that is no whole
# number, `ssb_unfit`'s failure in SQL Server's words (`user_kinds.unfit`), NULL where
# `safe` (TRY_CAST, TRY_CONVERT). SQL functions, which PostgreSQL writes into the
# statement (no call a row but where it fails; STABLE, so that a failing constant is not
# run while the statement is planned); made where missing at every start, as OPERATORS
WHOLE: Final = (
    f"DO $$ BEGIN IF to_regprocedure('{user_kinds.UNFIT}(text, text, text, boolean)') IS NULL THEN"
    + _unfit()
    + "".join(
        f" CREATE FUNCTION {user_kinds.WHOLE}({kind}, text, bigint, bigint, boolean)"
        f" RETURNS {kind}"
        f" LANGUAGE sql STABLE AS 'SELECT CASE WHEN {whole} BETWEEN $3 AND $4 THEN {whole}"
        f" ELSE CAST({user_kinds.UNFIT}(CAST({whole} AS text), $2, ''{source}'', $5) AS {kind})"
        " END';"
        for kind, whole, source in _WHOLES
    )
    + f" CREATE FUNCTION {user_kinds.WHOLE}(text, text, bigint, bigint, boolean)"
    f" RETURNS numeric"
    f" LANGUAGE sql STABLE AS 'SELECT CASE WHEN $1 !~ ''{user_kinds.WHOLE_TEXT}''"
    f" THEN {user_kinds.UNFIT}($1, $2, ''varchar'', $5)"
    f" WHEN {_TRIMMED} BETWEEN $3 AND $4 THEN {_TRIMMED}"
    f" ELSE {user_kinds.UNFIT}($1, $2, ''varchar'', $5) END';"
    " END IF; EXCEPTION WHEN insufficient_privilege THEN NULL; END $$",
)
INDEXES: Final = (
    "CREATE INDEX IF NOT EXISTS messages_by_conversation"
    " ON messages (status, queue, handle, queuing_order) INCLUDE (size)",
    *sql.INDEXES,
)


def create(db: psycopg.Connection[Any], where: str) -> None:
    """Make the schema where it is missing, or check that
    the database's schema is one this ssb knows (`db` in autocommit mode; `where` names
    the database in messages).

    Raises:
        StoreUnavailable: the database was written by a newer ssb.
        psycopg.Error: the database refused (the caller puts it into words).
    """
    with db.transaction():
        db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        db.execute(TABLES[0])
        row = db.execute("SELECT max(version) FROM ssb_schema").fetchone()
        version = None if row is None else row[0]
        if version is not None and int(str(version)) > SCHEMA_VERSION:
            raise StoreUnavailable(
                f"the store {where} was written by a newer ssb (schema {version}); run that"
                " version, or start from a backup"
            )
        for statement in (*TABLES[1:], *INDEXES, *OPERATORS, *AGGREGATES, *REPLICATE, *WHOLE):
            db.execute(statement)
        if version is None or int(str(version)) < SCHEMA_VERSION:
            for statement in FUNCTIONS:
                db.execute(statement)
        if version is not None and int(str(version)) < 3:
            fold_column_names(db)
        if version is None:
            db.execute("INSERT INTO ssb_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
        elif int(str(version)) < SCHEMA_VERSION:  # what it lacked was made just now
            db.execute("UPDATE ssb_schema SET version = %s", (SCHEMA_VERSION,))
        db.execute(
            "INSERT INTO commit_marks (id, token) VALUES (1, '') ON CONFLICT (id) DO NOTHING"
        )
        db.execute(
            "INSERT INTO broker_lease (id, epoch, holder, expires, renewed, taken)"
            " VALUES (1, 0, '', '-infinity', '-infinity', '-infinity')"
            " ON CONFLICT (id) DO NOTHING"
        )


# users' columns named otherwise than in lower case, with whether another column of
# their table has the same name but for case (`OrderId` beside `orderid` or `ORDERID`)
_UNFOLDED: Final = (
    "SELECT n.nspname, c.relname, a.attname, EXISTS (SELECT 1 FROM pg_attribute b"
    " WHERE b.attrelid = c.oid AND b.attnum > 0 AND NOT b.attisdropped"
    " AND b.attnum <> a.attnum AND lower(b.attname) = lower(a.attname))"
    " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname LIKE 'u:%' AND c.relkind IN ('r', 'p') AND a.attnum > 0"
    " AND NOT a.attisdropped AND a.attname <> lower(a.attname)"
)


def fold_column_names(db: psycopg.Connection[Any]) -> None:
    """Rename the columns of users' tables to lower case, keeping each declared name in
    its comment, as statements now write them (a database of schema 2 quoted them as
    declared); columns of one table whose names differ only in case keep theirs, and
    the log says so."""
    from psycopg import sql as pgsql  # (imported with the store, as psycopg is)

    for schema, table, column, clash in db.execute(_UNFOLDED).fetchall():
        where = pgsql.SQL("{}.{}").format(pgsql.Identifier(schema), pgsql.Identifier(table))
        if clash:
            log.warning(
                "column %r of table %s.%s keeps its name: another column of the table has"
                " the name %r in another case; rename one of them",
                column,
                schema,
                table,
                column.lower(),
            )
            continue
        db.execute(
            pgsql.SQL("COMMENT ON COLUMN {}.{} IS {}").format(
                where, pgsql.Identifier(column), pgsql.Literal(column)
            )
        )
        db.execute(
            pgsql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(
                where, pgsql.Identifier(column), pgsql.Identifier(column.lower())
            )
        )


def make_identity(db: psycopg.Connection[Any]) -> None:
    """Give the broker of a new database its instance id (a broker that has one keeps it;
    of daemons that start together on a new database, one makes it)."""
    db.execute(
        "INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING",
        (BROKER_INSTANCE, str(uuid.uuid4())),
    )
