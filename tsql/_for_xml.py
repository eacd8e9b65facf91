"""SELECT ... FOR XML PATH / RAW: a query's rows as one XML value, as SQL Server builds it.

Theory of operation. sqlglot reads the FOR XML clause onto its SELECT; the translation
(`rewrite`) turns that SELECT into an aggregate over itself: the original query, its
projections named c0, c1..., becomes the FROM of `SELECT tsql_for_xml(spec, c0, c1...)`,
and `ForXml`, a SQLite aggregate, builds the XML from the rows in the order the query
gives them. The spec (the mode, the row element, ROOT, ELEMENTS, and each column's name
and whether its value is XML already) travels as one text argument. Because it is an
aggregate, the same translation serves a whole query and a subquery in an expression
(`SET @body = (SELECT ... FOR XML PATH('order'), TYPE)`, or the list idiom
`STUFF((SELECT ',' + name ... FOR XML PATH('')), 1, 1, '')`).

PATH: each row is an element named by PATH('x') (none with PATH('')); a column named
`@a` is an attribute of it, `a/b` nested elements (adjacent columns share the elements
their paths share), `text()` or an unnamed expression text, `data()` the value
space-separated; a NULL leaves its attribute or element out. RAW: each row a `row`
element (or RAW('x')) with the columns as attributes, or as elements with ELEMENTS.
ROOT('r') wraps the rows. TYPE makes no difference to the text here: an XML value is
text on the SQL engine, and converts where it is assigned. AUTO, EXPLICIT, XMLSCHEMA,
XSINIL and BINARY BASE64 are refused, never ignored.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from xml.sax.saxutils import escape, quoteattr

from sqlglot import exp

from ._errors import NotSupported, SqlError

# the column SQL Server names a FOR XML result
RESULT_COLUMN: Final = "XML_F52E2B61-18A1-11d1-B105-00805F49916B"


@dataclass(frozen=True, slots=True)
class Spec:
    mode: str  # PATH or RAW
    row: str  # the row element ("" for PATH(''))
    root: str | None
    elements: bool  # RAW ... ELEMENTS
    columns: list[tuple[str, bool]]  # (name, the value is XML already)


def rewrite(select: exp.Select, deep: Any) -> exp.Expression:
    """`select` (which has a FOR XML clause) as the aggregate over itself; `deep`
    translates the inner query."""
    clause = select.args["for_"]
    spec = _spec(clause, select.expressions)
    inner = select.copy()
    inner.set("for_", None)
    _order_by_expressions(inner)
    inner.set(
        "expressions",
        [exp.alias_(_unaliased(e), f"c{i}") for i, e in enumerate(inner.expressions)],
    )
    call = exp.Anonymous(
        this="tsql_for_xml",
        expressions=[
            exp.Literal.string(json.dumps([spec.mode, spec.row, spec.root, spec.elements])),
            exp.Literal.string(json.dumps(spec.columns)),
            *(exp.column(f"c{i}", "tsql_xml_rows") for i in range(len(spec.columns))),
        ],
    )
    return exp.select(exp.alias_(call, RESULT_COLUMN, quoted=True)).from_(
        exp.Subquery(
            this=deep(inner), alias=exp.TableAlias(this=exp.to_identifier("tsql_xml_rows"))
        )
    )


def _order_by_expressions(select: exp.Select) -> None:
    """ORDER BY a column alias (which T-SQL allows) becomes ORDER BY its expression: the
    projections are renamed c0, c1... for the aggregate."""
    order = select.args.get("order")
    if order is None:
        return
    aliases = {
        e.alias.lower(): e.this for e in select.expressions if isinstance(e, exp.Alias) and e.alias
    }
    for ordered in order.expressions:
        key = ordered.this
        if isinstance(key, exp.Column) and not key.table and key.name.lower() in aliases:
            ordered.set("this", aliases[key.name.lower()].copy())


def _unaliased(e: exp.Expression) -> exp.Expression:
    return e.this if isinstance(e, exp.Alias) else e


def _spec(clause: exp.Expression, projections: list[exp.Expression]) -> Spec:
    if str(clause.args.get("kind", "")).upper() != "XML":
        raise NotSupported("FOR BROWSE / FOR JSON", "build the text in the script")
    mode, row, root, elements, typed = "", "row", None, False, False
    for option in clause.expressions:
        inner = option.this if isinstance(option, exp.QueryOption) else option
        if isinstance(inner, exp.XMLKeyValueOption):
            word = inner.this.name.upper()
            value = inner.expression.name if inner.expression is not None else None
        else:
            word, value = inner.name.upper(), None
        if word in ("PATH", "RAW"):
            mode, row = word, value if value is not None else "row"
        elif word == "ROOT":
            root = value if value is not None else "root"
        elif word == "ELEMENTS":
            elements = True
        elif word == "TYPE":
            typed = True
        else:
            raise NotSupported(
                f"FOR XML {word}",
                "ssb builds FOR XML PATH and RAW (with TYPE, ROOT and ELEMENTS)",
            )
    if not mode:
        raise NotSupported("FOR XML without PATH or RAW", "use FOR XML PATH or RAW")
    for name in (row if mode == "RAW" or row else None, root):
        if name is not None:
            _check_name(name, mode)
    del typed  # the text is the same (see the module's docstring)
    columns: list[tuple[str, bool]] = []
    for projection in projections:
        if isinstance(projection, exp.Star) or (
            isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star)
        ):
            raise NotSupported("SELECT * ... FOR XML", "name the columns the XML is made of")
        name = projection.alias_or_name if isinstance(projection, (exp.Alias, exp.Column)) else ""
        columns.append((name, _is_xml(_unaliased(projection))))
    return Spec(mode, row, root, elements, columns)


def _is_xml(e: exp.Expression) -> bool:
    """Whether a projection's value is XML, inserted as markup rather than as text."""
    if isinstance(e, (exp.Cast, exp.TryCast)):
        return bool(e.to.this == exp.DataType.Type.XML)
    if isinstance(e, exp.Subquery) and isinstance(e.this, exp.Select):
        return e.this.args.get("for_") is not None
    return False


class ForXml:
    """The SQLite aggregate `tsql_for_xml(spec, columns, value...)`; `failed` hears of a
    SqlError before SQLite turns it into its own."""

    def __init__(self, failed: Callable[[SqlError], None]) -> None:
        self.failed = failed
        self.spec: Spec | None = None
        self.parts: list[str] = []

    def step(self, spec: str, columns: str, *values: object) -> None:
        if self.spec is None:
            mode, row, root, elements = json.loads(spec)
            named = [(str(n), bool(x)) for n, x in json.loads(columns)]
            self.spec = Spec(mode, row, root, elements, named)
        build = _raw_row if self.spec.mode == "RAW" else _path_row
        try:
            self.parts.append(build(self.spec, values))
        except SqlError as exc:
            self.failed(exc)
            raise

    def finalize(self) -> str | None:
        if self.spec is None:
            return None  # no rows: NULL, as SQL Server gives
        body = "".join(self.parts)
        root = self.spec.root
        return body if root is None else f"<{root}>{body}</{root}>"


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _raw_row(spec: Spec, values: tuple[object, ...]) -> str:
    pairs = [(n, v, x) for (n, x), v in zip(spec.columns, values, strict=True) if v is not None]
    for name, _, _ in pairs:
        _check_name(name or "", "RAW")
    if not spec.elements:
        _distinct([n for n, _, _ in pairs])
    if spec.elements:
        inner = "".join(f"<{n}>{_content(v, x)}</{n}>" for n, v, x in pairs)
        return f"<{spec.row}>{inner}</{spec.row}>"
    attributes = "".join(f" {n}={quoteattr(_text(v))}" for n, v, _ in pairs)
    return f"<{spec.row}{attributes}/>"


def _content(value: object, is_xml: bool) -> str:
    return str(value) if is_xml else escape(_text(value))


def _path_row(spec: Spec, values: tuple[object, ...]) -> str:
    attributes: list[str] = []
    out: list[str] = []
    open_path: list[str] = []  # the elements of the previous column's path still open
    last_data = False
    for (name, is_xml), value in zip(spec.columns, values, strict=True):
        steps = name.split("/") if name else []
        leaf = steps[-1] if steps else ""
        parents = steps[:-1] if leaf.startswith("@") or leaf in _NODE_TESTS else steps
        if not parents and leaf.startswith("@"):
            if out:
                raise _attribute_after_element(name)
            _check_name(leaf[1:], "PATH")
            if value is not None:
                attributes.append(f" {leaf[1:]}={quoteattr(_text(value))}")
                _distinct([a.split("=", 1)[0].strip() for a in attributes])
            continue
        shared = 0
        while shared < min(len(open_path), len(parents)) and open_path[shared] == parents[shared]:
            shared += 1
        for element in reversed(open_path[shared:]):
            out.append(f"</{element}>")
        open_path = open_path[:shared]
        if value is None:
            continue
        for element in parents[shared:]:
            _check_name(element, "PATH")
            out.append(f"<{element}>")
            open_path.append(element)
        if leaf.startswith("@"):  # an attribute of the element just opened
            _check_name(leaf[1:], "PATH")
            if not out or not out[-1].startswith(f"<{parents[-1]}"):
                raise _attribute_after_element(name)
            out[-1] = out[-1][:-1] + f" {leaf[1:]}={quoteattr(_text(value))}>"
        elif leaf == "data()":
            out.append((" " if last_data else "") + _content(value, is_xml))
        else:
            out.append(_content(value, is_xml))
        last_data = leaf == "data()"
    for element in reversed(open_path):
        out.append(f"</{element}>")
    body = "".join(out)
    if not spec.row:
        return body
    start = f"<{spec.row}{''.join(attributes)}"
    return f"{start}>{body}</{spec.row}>" if body else f"{start}/>"


_NODE_TESTS: Final = ("", "text()", "data()", "node()", "*")


def _distinct(attributes: list[str]) -> None:
    seen: set[str] = set()
    for name in attributes:
        if name in seen:
            raise SqlError(
                6810,
                f"Column name '{name}' is repeated. The same attribute cannot be generated"
                " more than once on the same XML tag.",
            )
        seen.add(name)


def _attribute_after_element(name: str) -> SqlError:
    return SqlError(
        6852,
        f"Attribute-centric column '{name}' must not come after a non-attribute-centric"
        " sibling in XML hierarchy in FOR XML PATH.",
    )


def _check_name(name: str, mode: str) -> None:
    if (
        not name
        or not (name[0].isalpha() or name[0] == "_")
        or any(not (c.isalnum() or c in "_-.:") for c in name)
    ):
        raise SqlError(
            6850,
            f"Column name '{name}' contains an invalid XML identifier as required by FOR XML"
            f" {mode}.",
        )
