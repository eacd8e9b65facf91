"""Expressions, data types and SELECT, for the statement parser.

Precedence as SQL Server's: unary ~ - +; * / %; + - & ^ |; comparisons; NOT; AND; OR
(with BETWEEN, IN, LIKE and IS [NOT] NULL at the comparisons' level). A SELECT is parsed
whole, so that a statement not ended by `;` still ends where SQL Server ends it, and
keeps its text: a query that reads views or queues runs on the SQL engine from that
text (see _query), while the parts the interpreter evaluates itself (the select list of
a SELECT without FROM, assignments) are kept as trees.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

from . import _ast as ast
from . import _types as types
from ._cursor import RESERVED, STATEMENT_WORDS, Cursor
from ._errors import SqlError
from ._lexer import Kind, Token

_COMPARISONS = frozenset(("=", "<>", "!=", "<", ">", "<=", ">=", "!<", "!>"))
_ADDITIVE = frozenset(("+", "-", "&", "^", "|"))
_MULTIPLICATIVE = frozenset(("*", "/", "%"))
XML_METHODS = frozenset(("VALUE", "QUERY", "EXIST", "NODES", "MODIFY"))
_JOIN_WORDS = frozenset(("JOIN", "INNER", "LEFT", "RIGHT", "FULL", "CROSS", "OUTER"))


class ExpressionParser(Cursor):
    # ---- data types -------------------------------------------------------------------

    def data_type(self, *, declared: bool = True) -> types.SqlType:
        token = self.token
        if token.kind not in (Kind.NAME, Kind.QUOTED):
            self.fail()
        self.advance()
        name = str(token.value)
        if token.upper == "DOUBLE":
            self.take("PRECISION")
        if token.upper in ("NATIONAL",):
            self.fail(token)
        args: list[int] = []
        if self.take_op("("):
            while True:
                arg = self.token
                if arg.kind is Kind.NAME and arg.upper == "MAX":
                    args.append(types.MAX)
                elif arg.kind is Kind.INTEGER:
                    args.append(int(arg.value))  # type: ignore[call-overload]
                else:
                    self.fail()
                self.advance()
                if not self.take_op(","):
                    break
            self.expect_op(")")
        try:
            return types.make_type(name, tuple(args), declared=declared)
        except SqlError as exc:
            raise exc.at(token.line) from None

    # ---- expressions -------------------------------------------------------------------

    def expression(self) -> ast.Expr:
        left = self._and()
        while self.take("OR"):
            left = ast.Binary("OR", left, self._and())
        return left

    def _and(self) -> ast.Expr:
        left = self._not()
        while self.take("AND"):
            left = ast.Binary("AND", left, self._not())
        return left

    def _not(self) -> ast.Expr:
        if self.take("NOT"):
            return ast.Unary("NOT", self._not())
        return self._predicate()

    def _predicate(self) -> ast.Expr:
        left = self._additive()
        token = self.token
        if token.kind is Kind.OP and token.text in _COMPARISONS:
            self.advance()
            if self.at("ALL", "ANY", "SOME"):
                self.fail()
            return ast.Binary(token.text, left, self._additive())
        if self.take("IS"):
            negated = self.take("NOT") is not None
            self.expect("NULL")
            return ast.IsNull(left, negated)
        negated = False
        if self.at("NOT") and self.peek().upper in ("BETWEEN", "IN", "LIKE"):
            self.advance()
            negated = True
        if self.take("BETWEEN"):
            low = self._additive()
            self.expect("AND")
            return ast.Between(left, low, self._additive(), negated)
        if self.take("IN"):
            self.expect_op("(")
            if self.at("SELECT", "WITH"):
                query = self.select()
                self.expect_op(")")
                return ast.InQuery(left, query, negated)
            items = [self.expression()]
            while self.take_op(","):
                items.append(self.expression())
            self.expect_op(")")
            return ast.InList(left, tuple(items), negated)
        if self.take("LIKE"):
            pattern = self._additive()
            escape = self._additive() if self.take("ESCAPE") else None
            return ast.Like(left, pattern, escape, negated)
        if negated:
            self.fail()
        return left

    def _additive(self) -> ast.Expr:
        return self._left_associative(_ADDITIVE, self._multiplicative)

    def _multiplicative(self) -> ast.Expr:
        return self._left_associative(_MULTIPLICATIVE, self._unary)

    def _left_associative(
        self, operators: frozenset[str], operand: Callable[[], ast.Expr]
    ) -> ast.Expr:
        left = operand()
        while True:
            token = self.token
            if token.kind is not Kind.OP or token.text not in operators:
                return left
            self.advance()
            left = ast.Binary(token.text, left, operand())

    def _unary(self) -> ast.Expr:
        token = self.token
        if token.kind is Kind.OP and token.text in ("-", "+", "~"):
            self.advance()
            operand = self._unary()
            if token.text == "-" and isinstance(operand, ast.Literal):
                data = operand.value.data
                if isinstance(data, (int, float, Decimal)) and not isinstance(data, bool):
                    return ast.Literal(types.Value(-data, operand.value.type))
            return ast.Unary(token.text, operand)
        return self._postfix(self._primary())

    def _postfix(self, expr: ast.Expr) -> ast.Expr:
        # XML methods on any expression: CAST(x AS XML).value('...', 'int')
        while (
            self.at_op(".")
            and self.peek().kind is Kind.NAME
            and self.peek().upper in XML_METHODS
            and self.peek(2).text == "("
        ):
            self.advance()
            name = self.advance().upper.lower()
            expr = ast.Method(expr, name, self._arguments())
        return expr

    def _arguments(self, *, quantified: bool = False) -> tuple[ast.Expr, ...]:
        """A parenthesised argument list; `quantified`: a function's, which may start with
        DISTINCT or ALL (skipped)."""
        self.expect_op("(")
        args: list[ast.Expr] = []
        if self.take_op(")"):
            return ()
        if quantified:
            self.take("DISTINCT", "ALL")
        while True:
            args.append(self.expression())
            if not self.take_op(","):
                break
        self.expect_op(")")
        return tuple(args)

    def _primary(self) -> ast.Expr:
        token = self.token
        kind = token.kind
        if kind is Kind.VARIABLE:
            self.advance()
            return ast.Variable(token.text, token.upper)
        if kind is Kind.NSTRING:
            self.advance()
            text = str(token.value)
            return ast.Literal(types.Value(text, types.literal_text_type("NVARCHAR", text)))
        if kind is Kind.STRING:
            self.advance()
            text = str(token.value)
            return ast.Literal(types.Value(text, types.literal_text_type("VARCHAR", text)))
        if kind is Kind.INTEGER:
            self.advance()
            number = int(token.value)  # type: ignore[call-overload]
            if number < 2**31:
                return ast.Literal(types.Value(number, types.INT))
            if number < 2**63:
                return ast.Literal(types.Value(number, types.BIGINT))
            return ast.Literal(types.Value(Decimal(number), types.SqlType("NUMERIC", None, 38, 0)))
        if kind is Kind.DECIMAL:
            self.advance()
            value = token.value
            assert isinstance(value, Decimal)
            exponent = value.as_tuple().exponent
            scale = -exponent if isinstance(exponent, int) and exponent < 0 else 0
            precision = max(len(value.as_tuple().digits), scale, 1)
            return ast.Literal(types.Value(value, types.SqlType("NUMERIC", None, precision, scale)))
        if kind is Kind.FLOAT:
            self.advance()
            return ast.Literal(types.Value(token.value, types.FLOAT))
        if kind is Kind.BINARY:
            self.advance()
            data = token.value
            assert isinstance(data, bytes)
            return ast.Literal(types.Value(data, types.SqlType("VARBINARY", max(1, len(data)))))
        if kind is Kind.SYSTEM:
            self.advance()
            return ast.SystemFunction(token.upper)
        if kind is Kind.OP:
            if token.text == "(":
                self.advance()
                if self.at("SELECT", "WITH"):
                    query = self.select()
                    self.expect_op(")")
                    return ast.Subquery(query)
                inner = self.expression()
                self.expect_op(")")
                return inner
            if token.text == "*":
                self.advance()
                return ast.Star()
            self.fail()
        if kind is Kind.NAME:
            upper = token.upper
            if upper == "NULL":
                self.advance()
                return ast.Literal(types.NULL)
            if upper == "CASE":
                return self._case()
            if upper in ("CAST", "TRY_CAST") and self.peek().text == "(":
                return self._cast()
            if upper in ("CONVERT", "TRY_CONVERT") and self.peek().text == "(":
                return self._convert()
            if upper == "EXISTS":
                self.advance()
                self.expect_op("(")
                query = self.select()
                self.expect_op(")")
                return ast.Exists(query)
            if upper in (
                "CURRENT_TIMESTAMP",
                "CURRENT_USER",
                "SESSION_USER",
                "SYSTEM_USER",
                "USER",
            ):
                self.advance()
                return ast.Call(upper, (), token.line)
            if upper in RESERVED and upper not in ("COALESCE", "NULLIF", "LEFT", "RIGHT"):
                self.fail()
        if kind is Kind.NAME or kind is Kind.QUOTED:
            return self._name_expression()
        self.fail()

    def _name_expression(self) -> ast.Expr:
        first = self.advance()
        parts = [str(first.value)]
        while self.at_op(".") and self.peek().kind in (Kind.NAME, Kind.QUOTED, Kind.OP):
            following = self.peek()
            if following.kind is Kind.OP and following.text != "*":
                break
            if (
                following.kind is Kind.NAME
                and following.upper in XML_METHODS
                and self.peek(2).text == "("
            ):
                break  # a method of the column: _postfix takes it
            self.advance()
            if following.text == "*":
                self.advance()
                return ast.Star(".".join(parts))
            parts.append(str(self.advance().value))
        if (self.at_op("(") and first.kind is Kind.NAME) or (self.at_op("(") and len(parts) > 1):
            name = ".".join(p.upper() for p in parts)
            args = self._arguments(quantified=True)
            if self.take("WITHIN"):
                self.expect("GROUP")
                self._skip_parenthesised()
            if self.take("OVER"):
                self._skip_parenthesised()
            return ast.Call(name, args, first.line)
        return ast.Column(tuple(parts))

    def _skip_parenthesised(self) -> None:
        self.expect_op("(")
        depth = 1
        while depth:
            if self.at_end:
                self.fail()
            token = self.advance()
            if token.kind is Kind.OP:
                if token.text == "(":
                    depth += 1
                elif token.text == ")":
                    depth -= 1

    def _case(self) -> ast.Expr:
        self.expect("CASE")
        operand = None if self.at("WHEN") else self.expression()
        whens: list[tuple[ast.Expr, ast.Expr]] = []
        while self.take("WHEN"):
            condition = self.expression()
            self.expect("THEN")
            whens.append((condition, self.expression()))
        if not whens:
            self.fail()
        default = self.expression() if self.take("ELSE") else None
        self.expect("END")
        return ast.Case(operand, tuple(whens), default)

    def _cast(self) -> ast.Expr:
        safe = self.advance().upper == "TRY_CAST"
        self.expect_op("(")
        operand = self.expression()
        self.expect("AS")
        target = self.data_type(declared=False)
        self.expect_op(")")
        return self._postfix(ast.Cast(operand, target, None, safe))

    def _convert(self) -> ast.Expr:
        safe = self.advance().upper == "TRY_CONVERT"
        self.expect_op("(")
        target = self.data_type(declared=False)
        self.expect_op(",")
        operand = self.expression()
        style = self.expression() if self.take_op(",") else None
        self.expect_op(")")
        return self._postfix(ast.Cast(operand, target, style, safe))

    # ---- SELECT -------------------------------------------------------------------------

    def select(self) -> ast.Select:
        """A query: [WITH cte AS (...)] SELECT ... [UNION ...], ending where SQL Server's
        grammar ends it."""
        start = self.token
        if self.take("WITH"):
            while True:
                self.name()
                if self.at_op("("):
                    self._skip_parenthesised()
                self.expect("AS")
                self._skip_parenthesised()
                if not self.take_op(","):
                    break
        query = self._select_core(start)
        while self.at("UNION", "EXCEPT", "INTERSECT"):
            self.advance()
            self.take("ALL")
            if self.at_op("("):
                self._skip_parenthesised()
            else:
                self._select_core(self.token)
            query.has_from = True
        if self._order_and_options():
            query.has_from = True  # FOR XML: built on the SQL engine, even without FROM
        query.text = self.span(start)
        query.offset = start.start
        return query

    def _select_core(self, start: Token) -> ast.Select:
        select = self.expect("SELECT")
        distinct = bool(self.take("DISTINCT"))
        self.take("ALL")
        top: ast.Expr | None = None
        if self.take("TOP"):
            if self.take_op("("):
                top = self.expression()
                self.expect_op(")")
            else:
                top = self._primary()
            self.take("PERCENT")
            if self.take("WITH"):
                self.expect("TIES")
        items_start = self.token.start - start.start
        items = [self._select_item()]
        while self.take_op(","):
            items.append(self._select_item())
        items_end = self.tokens[self.i - 1].end - start.start
        into = None
        if self.take("INTO"):
            into = (
                self.dotted_name() if self.token.kind is not Kind.VARIABLE else self.advance().upper
            )
        has_from = False
        if self.take("FROM"):
            has_from = True
            self._table_sources()
        # WHERE, GROUP BY and HAVING filter even without FROM: the SQL engine runs them
        if self.take("WHERE"):
            has_from = True
            self.expression()
        if self.at_seq("GROUP", "BY"):
            has_from = True
            self.i += 2
            self._expressions()
        if self.take("HAVING"):
            has_from = True
            self.expression()
        return ast.Select(
            tuple(items), has_from, "", items_start, items_end, top, distinct, into, select.line
        )

    def _order_and_options(self) -> bool:
        """ORDER BY, FOR and OPTION clauses; whether there was a FOR clause."""
        if self.at_seq("ORDER", "BY"):
            self.i += 2
            while True:
                self.expression()
                self.take("ASC", "DESC")
                if not self.take_op(","):
                    break
            if self.take("OFFSET"):
                self.expression()
                self.expect("ROW", "ROWS")
                if self.take("FETCH"):
                    self.expect("NEXT", "FIRST")
                    self.expression()
                    self.expect("ROW", "ROWS")
                    self.expect("ONLY")
        has_for = self.at("FOR") and self.peek().upper in ("XML", "JSON", "BROWSE")
        if has_for:
            self.advance()
            self.advance()
            while True:
                if self.at(
                    "PATH",
                    "RAW",
                    "AUTO",
                    "EXPLICIT",
                    "ROOT",
                    "TYPE",
                    "ELEMENTS",
                    "BINARY",
                    "INCLUDE_NULL_VALUES",
                    "WITHOUT_ARRAY_WRAPPER",
                    "XSINIL",
                    "BASE64",
                    "XMLSCHEMA",
                    "XMLDATA",
                    "ABSENT",
                ):
                    self.advance()
                    if self.at_op("("):
                        self._skip_parenthesised()
                if not self.take_op(","):
                    break
        if self.take("OPTION"):
            self._skip_parenthesised()
        return has_for

    def _expressions(self) -> list[ast.Expr]:
        found = [self.expression()]
        while self.take_op(","):
            found.append(self.expression())
        return found

    def _select_item(self) -> ast.SelectItem:
        token = self.token
        following = self.peek()
        if (
            token.kind is Kind.VARIABLE
            and following.kind is Kind.OP
            and following.text
            in (
                "=",
                "+=",
                "-=",
                "*=",
                "/=",
                "%=",
                "&=",
                "|=",
                "^=",
            )
        ):
            self.i += 2
            start = self.token.start
            expr = self.expression()
            return ast.SelectItem(
                expr,
                None,
                token.upper,
                token.text,
                following.text,
                start,
                self.tokens[self.i - 1].end,
            )
        if (
            (
                token.kind is Kind.QUOTED
                or (token.kind is Kind.NAME and token.upper not in RESERVED)
                or token.kind is Kind.STRING
            )
            and following.kind is Kind.OP
            and following.text == "="
        ):
            self.i += 2
            start = self.token.start
            expr = self.expression()
            return ast.SelectItem(
                expr, str(token.value), start=start, end=self.tokens[self.i - 1].end
            )
        start = token.start
        expr = self.expression()
        end = self.tokens[self.i - 1].end
        return ast.SelectItem(expr, self._alias(), start=start, end=end)

    def _alias(self) -> str | None:
        if self.take("AS"):
            token = self.token
            if token.kind in (Kind.STRING, Kind.NSTRING):
                self.advance()
                return str(token.value)
            return self.name()
        token = self.token
        if token.kind is Kind.QUOTED or token.kind is Kind.STRING or token.kind is Kind.NSTRING:
            self.advance()
            return str(token.value)
        if (
            token.kind is Kind.NAME
            and token.upper not in RESERVED
            and token.upper not in STATEMENT_WORDS
        ):
            self.advance()
            return str(token.value)
        return None

    def _table_sources(self) -> None:
        self._table_source()
        while True:
            if self.take_op(","):
                self._table_source()
                continue
            if self.at("CROSS", "OUTER") and self.peek().upper == "APPLY":
                self.i += 2
                self._table_source()
                continue
            if self.at(*_JOIN_WORDS):
                cross = self.at("CROSS")
                while self.take("INNER", "LEFT", "RIGHT", "FULL", "OUTER", "CROSS"):
                    pass
                self.expect("JOIN")
                self._table_source()
                if not cross:
                    self.expect("ON")
                    self.expression()
                continue
            return

    def _table_source(self) -> None:
        token = self.token
        if token.kind is Kind.OP and token.text == "(":
            self.advance()
            if self.at("SELECT", "WITH"):
                self.select()
            else:
                self._table_sources()
            self.expect_op(")")
        elif token.kind is Kind.VARIABLE and self.peek().text != ".":
            self.advance()
        else:
            expr = self._postfix(self._primary())
            if not isinstance(expr, (ast.Column, ast.Call, ast.Method)):
                self.fail(token)
        if self.take("WITH"):
            self._skip_parenthesised()
        alias = self._alias()
        if alias is not None and self.at_op("("):
            self._skip_parenthesised()
        if self.take("WITH"):
            self._skip_parenthesised()
