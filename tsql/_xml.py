"""The XML type: parsing as SQL Server's XML parser does, and the methods
`.value()`, `.query()`, `.exist()` and `.nodes()` on lxml and elementpath (XPath 2.0).

Theory of operation. An XML value is kept as its text without the XML declaration, as
SQL Server keeps it. Bytes are decoded the way SQL Server's parser detects an encoding:
a byte-order mark, UTF-16 without one (a `<` followed by a zero byte), the encoding
declaration, else UTF-8. SQL Server's XML type also holds fragments (several top-level
elements, or text): a fragment is parsed inside a wrapper element and serialised
without it. A method parses the value once per call (a document is small next to the
round trip that brought it). XQuery prologs `declare namespace p="...";` and
`declare default element namespace "...";` become elementpath's namespace maps; what
XPath 2.0 cannot evaluate raises SQL Server's XQuery error (Msg 2389-style text, with
elementpath's reason).
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Any, Final

import elementpath
from lxml import etree

from ._errors import SqlError


@dataclass(frozen=True, slots=True)
class Xml:
    """An XML value: its text as SQL Server would return it (no XML declaration)."""

    text: str

    def __str__(self) -> str:
        return self.text


_DECLARATION: Final = re.compile(r"^\s*<\?xml[^>]*\?>", re.IGNORECASE)
_ENCODING: Final = re.compile(rb"^\s*<\?xml[^>]*encoding\s*=\s*[\"']([A-Za-z0-9._-]+)[\"']")
_PROLOG: Final = re.compile(
    r"""\s*declare\s+(?:(default\s+element\s+namespace)|namespace\s+([A-Za-z_][\w.-]*)\s*=)\s*
        (?:"([^"]*)"|'([^']*)')\s*;""",
    re.IGNORECASE | re.VERBOSE,
)
_WRAPPER: Final = "ssb-fragment"
_PARSER: Final = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)


def decode_xml_bytes(data: bytes) -> str:
    """XML bytes as text, by SQL Server's encoding detection."""
    if data.startswith(codecs.BOM_UTF16_LE):
        return data[2:].decode("utf-16-le", "replace")
    if data.startswith(codecs.BOM_UTF16_BE):
        return data[2:].decode("utf-16-be", "replace")
    if data.startswith(codecs.BOM_UTF8):
        return data[3:].decode("utf-8", "replace")
    if len(data) >= 2 and data[1] == 0 and data[0] != 0:
        return data.decode("utf-16-le", "replace")
    if len(data) >= 2 and data[0] == 0 and data[1] != 0:
        return data.decode("utf-16-be", "replace")
    declared = _ENCODING.match(data)
    encoding = declared.group(1).decode() if declared else "utf-8"
    try:
        return data.decode(encoding)
    except (LookupError, UnicodeDecodeError) as exc:
        raise SqlError(
            9402, f"XML parsing: line 1, character 1, unable to switch the encoding ({exc})"
        ) from None


def parse_xml(source: str | bytes) -> Xml:
    """Text or bytes as an XML value; SQL Server's Msg 9400 when it is not well formed."""
    text = decode_xml_bytes(source) if isinstance(source, bytes) else source
    text = _DECLARATION.sub("", text, count=1)
    _fragment(text)
    return Xml(text)


def _fragment(text: str) -> Any:
    """The wrapper element holding the fragment's nodes."""
    try:
        return etree.fromstring(f"<{_WRAPPER}>{text}</{_WRAPPER}>", _PARSER)
    except etree.XMLSyntaxError as exc:
        line, column = exc.position
        if line == 1:
            column = max(1, column - len(_WRAPPER) - 2)
        reason = str(exc.msg).split(", line")[0]
        if _WRAPPER in reason:
            reason = "unexpected end of input"
        raise SqlError(9400, f"XML parsing: line {line}, character {column}, {reason}") from None


def _root(value: Xml) -> Any:
    """What a path is evaluated on: the element of a single-element value, in a document
    of its own (so `/a` is absolute and `@n` is the element's, as for a node .nodes()
    gives), else the fragment's wrapper."""
    wrapper = _fragment(value.text)
    children = list(wrapper)
    if (
        len(children) == 1
        and not (wrapper.text or "").strip()
        and not (children[0].tail or "").strip()
    ):
        return etree.fromstring(etree.tostring(children[0]), _PARSER)
    return wrapper


def _select(value: Xml, xquery: str) -> list[Any]:
    namespaces: dict[str, str] = {}
    default: str | None = None
    rest = xquery
    while True:
        m = _PROLOG.match(rest)
        if m is None:
            break
        uri = m.group(3) if m.group(3) is not None else m.group(4)
        if m.group(1):
            default = uri
        else:
            namespaces[m.group(2)] = uri
        rest = rest[m.end() :]
    try:
        found = elementpath.select(
            _root(value), rest.strip(), namespaces=namespaces, default_namespace=default
        )
    except elementpath.ElementPathError as exc:
        raise SqlError(2389, f"XQuery [value()]: {exc}") from None
    return found if isinstance(found, list) else [found]


def _string(item: Any) -> str:
    if isinstance(item, etree._Element):
        return "".join(str(text) for text in item.itertext())
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, etree._ElementTree):
        return "".join(str(text) for text in item.getroot().itertext())
    return str(item)


def _serialise(item: Any) -> str:
    if isinstance(item, etree._Element):
        return etree.tostring(item, encoding=str, with_tail=False)
    if isinstance(item, etree._ElementTree):
        return etree.tostring(item.getroot(), encoding=str)
    return _string(item)


def xml_value(value: Xml, xquery: str) -> str | None:
    """`.value(xquery, type)`: the string value of the one item the path selects (None
    when it selects nothing); the caller converts it to the type."""
    found = _select(value, xquery)
    if len(found) > 1:
        raise SqlError(
            2389,
            "XQuery [value()]: 'value()' requires a singleton (or empty sequence), found"
            f" {len(found)} items",
        )
    return _string(found[0]) if found else None


def xml_query(value: Xml, xquery: str) -> Xml:
    """`.query(xquery)`: what the path selects, as XML."""
    found = _select(value, xquery)
    parts: list[str] = []
    for item in found:
        if parts and not isinstance(item, (etree._Element, etree._ElementTree)):
            parts.append(" ")
        parts.append(_serialise(item))
    return Xml("".join(parts))


def xml_exist(value: Xml, xquery: str) -> int:
    """`.exist(xquery)`: 1 when the path selects something, else 0."""
    found = _select(value, xquery)
    return 1 if found and found != [False] else 0


def xml_nodes(value: Xml, xquery: str) -> list[Xml]:
    """`.nodes(xquery)`: one XML value per node the path selects."""
    return [Xml(_serialise(item)) for item in _select(value, xquery)]
