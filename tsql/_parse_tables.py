"""Parsing the statements on tables: the broker's tables, whose text the broker reads
itself (the parser finds where each ends and which variables it names), and table
variables, which the session's SQL engine runs from their text.

CREATE / ALTER / DROP TABLE and INDEX run to the statement's end (a `;`, or the next
statement's first word outside parentheses); INSERT, UPDATE and DELETE are read alike
for a table and a table variable, with an OUTPUT clause skipped over.
"""

from __future__ import annotations

from typing import Final

from . import _ast as ast
from ._cursor import STATEMENT_WORDS
from ._errors import SqlError
from ._lexer import Kind, Token
from ._parse_broker import BrokerParser

# the words after CREATE / ALTER / DROP that name a table statement
TABLE_OBJECTS: Final = frozenset(("TABLE", "INDEX", "UNIQUE", "CLUSTERED", "NONCLUSTERED"))
# within ALTER TABLE name: the word that says what changes, not a new statement
_ALTER_ACTIONS: Final = frozenset(("ADD", "DROP", "ALTER"))


class TableParser(BrokerParser):
    """The table statements' part of the parser."""

    statement_start: Token  # the first token of the statement being parsed (the parser's)

    def table_object(self, line: int, start: Token, action: str, word: str) -> ast.Statement:
        """CREATE / ALTER / DROP of a table or an index (`word` just taken)."""
        if action == "DROP" and self.take("IF"):
            self.expect("EXISTS")
        creates = None
        if action == "CREATE" and word == "TABLE" and self.token.text.startswith("#"):
            creates = self.token.text
        if action == "ALTER" and word == "TABLE":
            self.table_name()
            if self.token.upper in _ALTER_ACTIONS:
                self.advance()
        self.statement_rest()
        return self._table_statement(line, start, creates)

    def table_name(self) -> None:
        self.name()
        while self.take_op("."):
            self.name()

    def table_output(self, *ends: str) -> None:
        """Skip an OUTPUT clause (the broker reads it) up to one of the words `ends`."""
        if not self.take("OUTPUT"):
            return
        depth = 0
        while not self.at_end:
            if self.at_op("("):
                depth += 1
            elif self.at_op(")"):
                depth -= 1
            elif depth <= 0 and (self.at(*ends) or self.at_op(";")):
                return
            self.advance()

    def _table_statement(
        self, line: int, start: Token, creates: str | None = None
    ) -> ast.TableStatement:
        first = self.tokens.index(start)
        variables = dict.fromkeys(
            t.upper for t in self.tokens[first : self.i] if t.kind is Kind.VARIABLE
        )
        return ast.TableStatement(line, self.span(start), tuple(variables), creates)

    def _merge(self, line: int) -> ast.Statement:
        """MERGE, to its `;` (which SQL Server requires: its WHEN clauses hold UPDATE and
        INSERT, words that start statements elsewhere)."""
        start = self.statement_start
        depth = 0
        while not self.at_end and not (depth <= 0 and self.at_op(";")):
            if self.at_op("("):
                depth += 1
            elif self.at_op(")"):
                depth -= 1
            self.advance()
        if self.at_end:
            raise SqlError(
                10713, "A MERGE statement must be terminated by a semi-colon (;).", line=line
            )
        return self._table_statement(line, start)

    # ---- INSERT, UPDATE, DELETE of a table or a table variable ------------------------

    def _insert(self, line: int) -> ast.Statement:
        start = self.statement_start
        self.take("INTO")
        target = self._target()
        if self.at_op("("):
            self._skip_parenthesised()
        self.table_output("VALUES", "SELECT", "DEFAULT", "WITH")
        if self.take("VALUES"):
            while True:
                self.expect_op("(")
                self._expressions()
                self.expect_op(")")
                if not self.take_op(","):
                    break
        elif self.take("DEFAULT"):
            self.expect("VALUES")
        else:
            self.select()
        return self._change(line, "INSERT", target, start)

    def _update(self, line: int) -> ast.Statement:
        start = self.statement_start
        target = self._target()
        self.expect("SET")
        while True:
            self.name()
            self.expect_op("=")
            self.expression()
            if not self.take_op(","):
                break
        self.table_output("WHERE", *STATEMENT_WORDS)
        if self.take("WHERE"):
            self.expression()
        return self._change(line, "UPDATE", target, start)

    def _delete(self, line: int) -> ast.Statement:
        start = self.statement_start
        self.take("FROM")
        target = self._target()
        self.table_output("WHERE", *STATEMENT_WORDS)
        if self.take("WHERE"):
            self.expression()
        return self._change(line, "DELETE", target, start)

    def _target(self) -> str | None:
        """The table variable a statement changes (its key), or None for a table."""
        token = self.token
        if token.kind is not Kind.VARIABLE:
            self.table_name()
            return None
        self.advance()
        return token.upper

    def _change(self, line: int, action: str, target: str | None, start: Token) -> ast.Statement:
        if target is None:
            return self._table_statement(line, start)
        return ast.TableChange(line, action, target, self.span(start))
