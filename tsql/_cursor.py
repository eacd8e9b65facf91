"""The parser's cursor over a batch's tokens: looking ahead, taking words and
punctuation, and SQL Server's syntax errors (Msg 102 / 156) naming the token."""

from __future__ import annotations

from typing import Final, NoReturn

from ._errors import SqlError, syntax_error
from ._lexer import Kind, Token

# SQL Server's reserved keywords: never a bare alias, and named "the keyword" in errors
RESERVED: Final = frozenset(
    [
        "ADD",
        "ALL",
        "ALTER",
        "AND",
        "ANY",
        "AS",
        "ASC",
        "AUTHORIZATION",
        "BACKUP",
        "BEGIN",
        "BETWEEN",
        "BREAK",
        "BROWSE",
        "BULK",
        "BY",
        "CASCADE",
        "CASE",
        "CHECK",
        "CHECKPOINT",
        "CLOSE",
        "CLUSTERED",
        "COALESCE",
        "COLLATE",
        "COLUMN",
        "COMMIT",
        "COMPUTE",
        "CONSTRAINT",
        "CONTAINS",
        "CONTAINSTABLE",
        "CONTINUE",
        "CONVERT",
        "CREATE",
        "CROSS",
        "CURRENT",
        "CURRENT_DATE",
        "CURRENT_TIME",
        "CURRENT_TIMESTAMP",
        "CURRENT_USER",
        "CURSOR",
        "DATABASE",
        "DBCC",
        "DEALLOCATE",
        "DECLARE",
        "DEFAULT",
        "DELETE",
        "DENY",
        "DESC",
        "DISK",
        "DISTINCT",
        "DISTRIBUTED",
        "DOUBLE",
        "DROP",
        "DUMP",
        "ELSE",
        "END",
        "ERRLVL",
        "ESCAPE",
        "EXCEPT",
        "EXEC",
        "EXECUTE",
        "EXISTS",
        "EXIT",
        "EXTERNAL",
        "FETCH",
        "FILE",
        "FILLFACTOR",
        "FOR",
        "FOREIGN",
        "FREETEXT",
        "FREETEXTTABLE",
        "FROM",
        "FULL",
        "FUNCTION",
        "GOTO",
        "GRANT",
        "GROUP",
        "HAVING",
        "HOLDLOCK",
        "IDENTITY",
        "IDENTITY_INSERT",
        "IDENTITYCOL",
        "IF",
        "IN",
        "INDEX",
        "INNER",
        "INSERT",
        "INTERSECT",
        "INTO",
        "IS",
        "JOIN",
        "KEY",
        "KILL",
        "LEFT",
        "LIKE",
        "LINENO",
        "LOAD",
        "MERGE",
        "NATIONAL",
        "NOCHECK",
        "NONCLUSTERED",
        "NOT",
        "NULL",
        "NULLIF",
        "OF",
        "OFF",
        "OFFSETS",
        "ON",
        "OPEN",
        "OPENDATASOURCE",
        "OPENQUERY",
        "OPENROWSET",
        "OPENXML",
        "OPTION",
        "OR",
        "ORDER",
        "OUTER",
        "OVER",
        "PERCENT",
        "PIVOT",
        "PLAN",
        "PRECISION",
        "PRIMARY",
        "PRINT",
        "PROC",
        "PROCEDURE",
        "PUBLIC",
        "RAISERROR",
        "READ",
        "READTEXT",
        "RECONFIGURE",
        "REFERENCES",
        "REPLICATION",
        "RESTORE",
        "RESTRICT",
        "RETURN",
        "REVERT",
        "REVOKE",
        "RIGHT",
        "ROLLBACK",
        "ROWCOUNT",
        "ROWGUIDCOL",
        "RULE",
        "SAVE",
        "SCHEMA",
        "SECURITYAUDIT",
        "SELECT",
        "SESSION_USER",
        "SET",
        "SETUSER",
        "SHUTDOWN",
        "SOME",
        "STATISTICS",
        "SYSTEM_USER",
        "TABLE",
        "TABLESAMPLE",
        "TEXTSIZE",
        "THEN",
        "TO",
        "TOP",
        "TRAN",
        "TRANSACTION",
        "TRIGGER",
        "TRUNCATE",
        "TRY_CONVERT",
        "TSEQUAL",
        "UNION",
        "UNIQUE",
        "UNPIVOT",
        "UPDATE",
        "UPDATETEXT",
        "USE",
        "USER",
        "VALUES",
        "VARYING",
        "VIEW",
        "WAITFOR",
        "WHEN",
        "WHERE",
        "WHILE",
        "WITH",
        "WRITETEXT",
    ]
)
# words that start a statement: not taken as a bare alias either
STATEMENT_WORDS: Final = frozenset(
    ["SEND", "RECEIVE", "GET", "MOVE", "THROW", "APPLY", "OUTPUT", "OUT", "READONLY"]
)


class Cursor:
    """A position in a batch's tokens (the last one is END)."""

    def __init__(self, tokens: list[Token], text: str) -> None:
        self.tokens = tokens
        self.text = text
        self.i = 0

    @property
    def token(self) -> Token:
        return self.tokens[self.i]

    def peek(self, ahead: int = 1) -> Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        token = self.tokens[self.i]
        if token.kind is not Kind.END:
            self.i += 1
        return token

    @property
    def at_end(self) -> bool:
        return self.tokens[self.i].kind is Kind.END

    def at(self, *words: str) -> bool:
        token = self.tokens[self.i]
        return token.kind is Kind.NAME and token.upper in words

    def at_seq(self, *words: str) -> bool:
        for ahead, word in enumerate(words):
            token = self.peek(ahead)
            if token.kind is not Kind.NAME or token.upper != word:
                return False
        return True

    def take(self, *words: str) -> Token | None:
        return self.advance() if self.at(*words) else None

    def expect(self, *words: str) -> Token:
        token = self.take(*words)
        if token is None:
            self.fail()
        return token

    def at_op(self, *ops: str) -> bool:
        token = self.tokens[self.i]
        return token.kind is Kind.OP and token.text in ops

    def take_op(self, *ops: str) -> Token | None:
        return self.advance() if self.at_op(*ops) else None

    def expect_op(self, op: str) -> Token:
        token = self.take_op(op)
        if token is None:
            self.fail()
        return token

    def name(self) -> str:
        """An identifier: a plain name that is not reserved, or a quoted one."""
        token = self.tokens[self.i]
        if token.kind is Kind.QUOTED or (token.kind is Kind.NAME and token.upper not in RESERVED):
            self.i += 1
            return str(token.value)
        self.fail()

    def dotted_name(self) -> str:
        """schema.object or db.schema.object, joined with dots (empty parts kept)."""
        parts = [self.name()]
        while self.at_op(".") and self.peek().kind in (Kind.NAME, Kind.QUOTED, Kind.OP):
            self.advance()
            if self.at_op("."):
                parts.append("")
                continue
            parts.append(self.name())
        return ".".join(parts)

    def is_name(self, token: Token | None = None) -> bool:
        token = token or self.tokens[self.i]
        return token.kind is Kind.QUOTED or (
            token.kind is Kind.NAME and token.upper not in RESERVED
        )

    def variable(self) -> Token:
        token = self.tokens[self.i]
        if token.kind is not Kind.VARIABLE:
            self.fail()
        self.i += 1
        return token

    def fail(self, token: Token | None = None) -> NoReturn:
        """Msg 102 / 156 near the current token (the last one, at the end of the batch)."""
        raise self.error(token)

    def error(self, token: Token | None = None) -> SqlError:
        token = token or self.tokens[self.i]
        if token.kind is Kind.END:
            previous = self.tokens[self.i - 1] if self.i else token
            return syntax_error(
                previous.text or "", keyword=False, line=previous.line, column=previous.column
            )
        keyword = token.kind is Kind.NAME and token.upper in RESERVED
        return syntax_error(token.text, keyword=keyword, line=token.line, column=token.column)

    def span(self, start: Token) -> str:
        """The batch's text from `start` to the last token taken."""
        last = self.tokens[self.i - 1]
        return self.text[start.start : last.end]
