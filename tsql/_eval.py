"""The expression evaluator: a syntax tree and a frame of variables to a typed value.

Theory of operation. Evaluation is synchronous and dispatches on the node's class.
Subqueries (EXISTS, IN (SELECT ...), a scalar (SELECT ...)) need the SQL engine, which
may read the broker's views, so `value()` first runs the subqueries an expression holds
(found once per expression and cached) and then evaluates the rest without awaiting.
Three-valued logic as SQL Server's: a predicate is True, False or None (unknown), and
IF / WHILE treat unknown as false.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, is_dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

from . import _ast as ast
from . import _types as t
from ._errors import SqlError
from ._functions import DATE_PART_FUNCTIONS, SCALARS
from ._operators import arithmetic, compare
from ._types import Value
from ._xml import xml_exist, xml_nodes, xml_query, xml_value

if TYPE_CHECKING:
    from ._context import Context
    from ._frame import Frame


class Evaluator:
    """Evaluates expressions for one session."""

    def __init__(self, session: Context) -> None:
        self.session = session
        self.results: dict[int, Any] = {}  # subquery answers for the current evaluation
        # per expression (kept alive here, so that its id is never reused)
        self._subqueries: dict[int, tuple[ast.Expr, tuple[ast.Expr, ...]]] = {}
        self._dispatch: dict[type, Callable[[Any, Frame], Value]] = {
            ast.Literal: self._literal,
            ast.Variable: self._variable,
            ast.SystemFunction: self._system,
            ast.Column: self._column,
            ast.Unary: self._unary,
            ast.Binary: self._binary,
            ast.IsNull: self._is_null,
            ast.Between: self._between,
            ast.InList: self._in_list,
            ast.InQuery: self._in_query,
            ast.Like: self._like,
            ast.Case: self._case,
            ast.Cast: self._cast,
            ast.Call: self._call,
            ast.Method: self._method,
            ast.Exists: self._exists,
            ast.Subquery: self._subquery,
            ast.Star: self._star,
        }

    async def value(self, expr: ast.Expr, frame: Frame) -> Value:
        """The value of `expr` (running its subqueries first)."""
        known = self._subqueries.get(id(expr))
        if known is None:
            known = (expr, tuple(_find_subqueries(expr)))
            self._subqueries[id(expr)] = known
        queries = known[1]
        if queries:
            for node in queries:
                self.results[id(node)] = await self.session.subquery(node, frame)
        return self._dispatch[type(expr)](expr, frame)

    async def condition(self, expr: ast.Expr, frame: Frame) -> bool:
        """A predicate's truth for IF and WHILE (unknown counts as false)."""
        return bool((await self.value(expr, frame)).data)

    def sync(self, expr: ast.Expr, frame: Frame) -> Value:
        return self._dispatch[type(expr)](expr, frame)

    # ---- nodes ----------------------------------------------------------------------------

    def _literal(self, node: ast.Literal, frame: Frame) -> Value:
        return node.value

    def _variable(self, node: ast.Variable, frame: Frame) -> Value:
        slot = frame.variables.get(node.key)
        if slot is None:
            raise SqlError(137, f'Must declare the scalar variable "{node.name}".', level=15)
        if slot.table is not None:
            raise SqlError(137, f'Must declare the scalar variable "{node.name}".', level=15)
        return slot.value

    def _system(self, node: ast.SystemFunction, frame: Frame) -> Value:
        return self.session.system_function(node.name)

    def _column(self, node: ast.Column, frame: Frame) -> Value:
        row = frame.row
        if row is not None:
            found = row.get(node.name.lower())
            if found is not None:
                return found
        raise SqlError(207, f"Invalid column name '{node.name}'.")

    def _star(self, node: ast.Star, frame: Frame) -> Value:
        raise SqlError(102, "Incorrect syntax near '*'.", level=15)

    def _unary(self, node: ast.Unary, frame: Frame) -> Value:
        operand = self.sync(node.operand, frame)
        if node.op == "NOT":
            truth = operand.data
            return Value(None if truth is None else (0 if truth else 1), t.BIT)
        if operand.data is None:
            return operand
        if node.op == "-":
            if operand.type.family in ("char", "nchar"):
                operand = t.convert(operand, t.FLOAT)
            return Value(-operand.data, operand.type)  # type: ignore[operator]
        if node.op == "~":
            return Value(~operand.data, operand.type)  # type: ignore[operator]
        return operand

    def _binary(self, node: ast.Binary, frame: Frame) -> Value:
        op = node.op
        if op == "AND":
            left = self.sync(node.left, frame).data
            if left is not None and not left:
                return t.FALSE
            right = self.sync(node.right, frame).data
            if right is not None and not right:
                return t.FALSE
            return t.TRUE if left is not None and right is not None else Value(None, t.BIT)
        if op == "OR":
            left = self.sync(node.left, frame).data
            if left:
                return t.TRUE
            right = self.sync(node.right, frame).data
            if right:
                return t.TRUE
            return t.FALSE if left is not None and right is not None else Value(None, t.BIT)
        a = self.sync(node.left, frame)
        b = self.sync(node.right, frame)
        if op in _COMPARISONS:
            truth = compare(op, a, b)
            return Value(None if truth is None else int(truth), t.BIT)
        if (a.type.name in _DECIMALS) != (b.type.name in _DECIMALS):
            # an integer constant meets a DECIMAL as a DECIMAL of its own digits (1.0 / 3 is
            # DECIMAL(2,1) / DECIMAL(1,0)), as SQL Server types constants
            a, b = _constant(node.left, a), _constant(node.right, b)
        return arithmetic(op, a, b)

    def _is_null(self, node: ast.IsNull, frame: Frame) -> Value:
        null = self.sync(node.operand, frame).data is None
        return t.TRUE if null != node.negated else t.FALSE

    def _between(self, node: ast.Between, frame: Frame) -> Value:
        value = self.sync(node.operand, frame)
        low = compare(">=", value, self.sync(node.low, frame))
        high = compare("<=", value, self.sync(node.high, frame))
        if low is False or high is False:
            truth: bool | None = False
        elif low is None or high is None:
            truth = None
        else:
            truth = True
        return _truth(truth, node.negated)

    def _in_list(self, node: ast.InList, frame: Frame) -> Value:
        value = self.sync(node.operand, frame)
        return _truth(_member(value, [self.sync(item, frame) for item in node.items]), node.negated)

    def _in_query(self, node: ast.InQuery, frame: Frame) -> Value:
        value = self.sync(node.operand, frame)
        return _truth(_member(value, self.results[id(node)]), node.negated)

    def _like(self, node: ast.Like, frame: Frame) -> Value:
        from ._like import like

        value = self.sync(node.operand, frame)
        pattern = self.sync(node.pattern, frame)
        escape = self.sync(node.escape, frame) if node.escape is not None else None
        if value.data is None or pattern.data is None:
            return Value(None, t.BIT)
        truth = like(
            t.to_text(value), t.to_text(pattern), None if escape is None else t.to_text(escape)
        )
        return _truth(truth, node.negated)

    def _case(self, node: ast.Case, frame: Frame) -> Value:
        if node.operand is not None:
            operand = self.sync(node.operand, frame)
            for when, then in node.whens:
                if compare("=", operand, self.sync(when, frame)):
                    return self.sync(then, frame)
        else:
            for when, then in node.whens:
                if self.sync(when, frame).data:
                    return self.sync(then, frame)
        if node.default is not None:
            return self.sync(node.default, frame)
        return t.NULL

    def _cast(self, node: ast.Cast, frame: Frame) -> Value:
        value = self.sync(node.operand, frame)
        style = None
        if node.style is not None:
            style_value = self.sync(node.style, frame)
            style = None if style_value.data is None else t.as_int(style_value)
        if not node.safe:
            return t.convert(value, node.type, style)
        try:
            return t.convert(value, node.type, style)
        except SqlError:
            return Value(None, node.type)

    def _call(self, node: ast.Call, frame: Frame) -> Value:
        name = node.name
        if name in ASKS_THE_BROKER:
            answer: Value = self.results[id(node)]
            return answer
        function = SCALARS.get(name)
        args = node.args
        if name in DATE_PART_FUNCTIONS and args and isinstance(args[0], ast.Column):
            first: list[Value] = [Value(args[0].name, t.VARCHAR)]
            values = first + [self.sync(a, frame) for a in args[1:]]
        else:
            values = [self.sync(a, frame) for a in args]
        if function is not None:
            try:
                return function(*values)
            except TypeError:
                raise SqlError(
                    174, f"The {name.lower()} function requires a different number of arguments."
                ) from None
        return self.session.session_function(name, values)

    def _method(self, node: ast.Method, frame: Frame) -> Value:
        target = self.sync(node.target, frame)
        args = [self.sync(a, frame) for a in node.args]
        if target.type.family != "xml":
            if target.data is None:
                return Value(None, t.XML)
            raise SqlError(258, f"Cannot call methods on {target.type.name.lower()}.")
        if target.data is None:
            return Value(None, t.INT if node.name == "exist" else t.XML)
        document = target.data
        assert isinstance(document, t.Xml)
        texts = [t.to_text(a) for a in args]
        if node.name == "value" and len(texts) == 2:
            return typed_value(document, texts[0], texts[1])
        if node.name == "query" and len(texts) == 1:
            return Value(xml_query(document, texts[0]), t.XML)
        if node.name == "exist" and len(texts) == 1:
            return Value(xml_exist(document, texts[0]), t.BIT)
        if node.name == "nodes":
            raise SqlError(
                40517,
                "the xml nodes() method returns rows: use it in FROM ... CROSS APPLY"
                " x.nodes('...') AS T(c)",
            )
        if node.name == "modify":
            raise SqlError(40517, "xml modify() is not supported by ssb: build the XML anew")
        raise SqlError(174, f"The {node.name} function requires a different number of arguments.")

    def _exists(self, node: ast.Exists, frame: Frame) -> Value:
        return t.TRUE if self.results[id(node)] else t.FALSE

    def _subquery(self, node: ast.Subquery, frame: Frame) -> Value:
        found: Value = self.results[id(node)]
        return found


_COMPARISONS: Final = frozenset(("=", "<>", "!=", "<", ">", "<=", ">=", "!<", "!>"))
# functions whose answer the broker gives: run before the expression, as subqueries are
ASKS_THE_BROKER: Final = frozenset(("OBJECT_ID", "DB_ID", "DB_NAME"))


_DECIMALS: Final = frozenset(("DECIMAL", "NUMERIC"))


def _constant(node: ast.Expr, value: Value) -> Value:
    """An integer literal (or its negation) as the DECIMAL of its digits; else `value`."""
    if isinstance(node, ast.Unary) and node.op in ("-", "+"):
        node = node.operand
    data = value.data
    if not isinstance(node, ast.Literal) or value.type.name != "INT" or not isinstance(data, int):
        return value
    return Value(Decimal(data), t.SqlType("NUMERIC", None, len(str(abs(data))), 0))


def _truth(truth: bool | None, negated: bool) -> Value:
    if truth is None:
        return Value(None, t.BIT)
    return t.TRUE if truth != negated else t.FALSE


def _member(value: Value, items: list[Value]) -> bool | None:
    unknown = False
    for item in items:
        found = compare("=", value, item)
        if found:
            return True
        if found is None:
            unknown = True
    return None if unknown else False


def _find_subqueries(node: object) -> list[ast.Expr]:
    """The subquery nodes of an expression (not those nested inside a subquery)."""
    found: list[ast.Expr] = []
    if isinstance(node, ast.Call) and node.name in ASKS_THE_BROKER:
        found.append(node)
        for arg in node.args:
            found.extend(_find_subqueries(arg))
        return found
    if isinstance(node, (ast.Exists, ast.Subquery, ast.InQuery)):
        found.append(node)
        if isinstance(node, ast.InQuery):
            found.extend(_find_subqueries(node.operand))
        return found
    if is_dataclass(node) and not isinstance(node, (ast.Select, Value)):
        for f in fields(node):
            child = getattr(node, f.name)
            if isinstance(child, ast.Expr):
                found.extend(_find_subqueries(child))
            elif isinstance(child, tuple):
                for item in child:
                    if isinstance(item, ast.Expr):
                        found.extend(_find_subqueries(item))
                    elif isinstance(item, tuple):
                        for inner in item:
                            found.extend(_find_subqueries(inner))
    return found


def typed_value(document: t.Xml, xquery: str, type_name: str) -> Value:
    """`.value(xquery, 'type')`: the item the path selects, as `type` (NULL if none)."""
    target = t.parse_type_name(type_name)
    if target.family == "xml":
        raise SqlError(2389, "XQuery [value()]: the type of value() cannot be xml; use query()")
    found = xml_value(document, xquery)
    return t.convert(Value(found, t.NVARCHAR_MAX), target)


def xml_rows(document: Value, xquery: str) -> list[Value]:
    """`.nodes()` as rows of XML values (for the SQL engine)."""
    if document.data is None:
        return []
    assert isinstance(document.data, t.Xml)
    return [Value(node, t.XML) for node in xml_nodes(document.data, xquery)]
