"""Parsing the statements on the broker's tables: what the parser needs to find where
each ends and which variables it names; the broker reads the text itself.

CREATE / ALTER / DROP TABLE and INDEX run to the statement's end (a `;`, or the next
statement's first word outside parentheses); INSERT, UPDATE and DELETE of a table are
read as those of a table variable are, with an OUTPUT clause skipped over.
"""

from __future__ import annotations

from typing import Final

from . import _ast as ast
from ._lexer import Kind, Token
from ._parse_broker import BrokerParser

# the words after CREATE / ALTER / DROP that name a table statement
TABLE_OBJECTS: Final = frozenset(("TABLE", "INDEX", "UNIQUE", "CLUSTERED", "NONCLUSTERED"))
# within ALTER TABLE name: the word that says what changes, not a new statement
_ALTER_ACTIONS: Final = frozenset(("ADD", "DROP", "ALTER"))


class TableParser(BrokerParser):
    """The table statements' part of the parser."""

    def table_object(self, line: int, start: Token, action: str, word: str) -> ast.Statement:
        """CREATE / ALTER / DROP of a table or an index (`word` just taken)."""
        if action == "DROP" and self.take("IF"):
            self.expect("EXISTS")
        if action == "ALTER" and word == "TABLE":
            self.table_name()
            if self.token.upper in _ALTER_ACTIONS:
                self.advance()
        self.statement_rest()
        return self._table_statement(line, start)

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

    def _table_statement(self, line: int, start: Token) -> ast.TableStatement:
        first = self.tokens.index(start)
        variables = dict.fromkeys(
            t.upper for t in self.tokens[first : self.i] if t.kind is Kind.VARIABLE
        )
        return ast.TableStatement(line, self.span(start), tuple(variables))
