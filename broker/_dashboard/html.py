"""The dashboard's HTML: escaping, tables, forms, the page layout, its responses.

Everything that comes from the broker or a request goes through `esc` (or `url`) on
its way into a page."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlencode

from aiohttp import web
from multidict import MultiDictProxy

from .sessions import WebSession

ROOT: Final = "/dashboard"
BODY_PREVIEW: Final = 80  # characters of a body in a table
ROW_LIMIT: Final = 200
MAX_NAME: Final = 1024  # characters of a name taken from a form

HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self';"
        " frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


Rows = list[dict[str, Any]]


NAV: Final = (
    ("queues", "Queues"),
    ("conversations", "Conversations"),
    ("transmission", "Transmission queue"),
    ("connections", "Broker connections"),
    ("tasks", "Activated tasks"),
    ("tables", "Tables"),
    ("poison", "Poison and dead letters"),
)

STYLE: Final = """\
body { font-family: system-ui, sans-serif; margin: 0; color: #222; }
header { background: #1f3b5c; color: #fff; padding: 0.5em 1em; display: flex;
         flex-wrap: wrap; gap: 1em; align-items: center; }
header a { color: #fff; }
header a.here { font-weight: bold; text-decoration: none; }
header .who { margin-left: auto; }
header form { display: inline; }
main { padding: 1em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
th { background: #eef2f7; }
td form { margin: 0; }
.error { color: #a00; background: #fdecec; padding: 0.4em 0.6em; border-left: 4px solid #a00; }
.ok { color: #060; background: #ebf7eb; padding: 0.4em 0.6em; border-left: 4px solid #060; }
.note { color: #555; font-style: italic; }
.status-ON { color: #060; }
.status-OFF, .status-disabled { color: #a00; font-weight: bold; }
pre.body { background: #f6f6f6; padding: 0.5em; white-space: pre-wrap; word-break: break-all; }
.chart text { font-size: 11px; fill: #444; }
form.login { display: grid; gap: 0.5em; max-width: 20em; }
"""

# (view column, heading) of the tables that show a chosen few columns
ENDPOINT_COLUMNS: Final = (
    ("service_name", "service"),
    ("far_service", "far service"),
    ("service_contract_name", "contract"),
    ("state", "state"),
    ("conversation_group_id", "group"),
    ("queue_name", "queue"),
    ("priority", "priority"),
    ("lifetime", "lifetime"),
)
TRANSMISSION_COLUMNS: Final = (
    ("id", "id"),
    ("conversation_handle", "handle"),
    ("to_service_name", "to service"),
    ("to_broker_instance", "to broker"),
    ("message_type_name", "message type"),
    ("message_sequence_number", "sequence"),
    ("priority", "priority"),
    ("enqueue_time", "enqueued"),
    ("message_body_length", "bytes"),
    ("transmission_status", "why it waits"),
)

ICON: Final = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    '<rect width="16" height="16" rx="3" fill="#1f3b5c"/>'
    '<path d="M3 11h10M3 8h7M3 5h4" stroke="#fff" stroke-width="1.5"/></svg>'
)


def esc(value: object) -> str:
    """A value from the broker or the request, as HTML text."""
    return html.escape(_text(value), quote=True)


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, bytes):
        return body_text(value, BODY_PREVIEW)
    return str(value)


def body_text(body: bytes, limit: int) -> str:
    """A body as text, at most `limit` characters (invalid UTF-8 shows as U+FFFD)."""
    text = body[: limit * 4].decode("utf-8", errors="replace")
    if len(text) <= limit and len(body) <= limit * 4:
        return text
    return f"{text[:limit]}… ({len(body):,} bytes)"


def url(path: str, **query: object) -> str:
    """A dashboard URL (escape it for an attribute with `esc`)."""
    pairs = {k: str(v) for k, v in query.items() if v is not None}
    return f"{ROOT}/{path}" + (f"?{urlencode(pairs)}" if pairs else "")


def link(path: str, label: object, **query: object) -> str:
    return f'<a href="{esc(url(path, **query))}">{esc(label)}</a>'


def table(headings: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Cells are HTML already (escape what goes in them)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headings)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def plain_table(rows: Rows) -> str:
    """Every column of a view, escaped."""
    if not rows:
        return '<p class="note">None.</p>'
    columns = list(rows[0])
    return table(columns, ([esc(row.get(c)) for c in columns] for row in rows))


def capped(rows: Rows, limit: int = ROW_LIMIT) -> tuple[Rows, str]:
    """At most `limit` rows, and a note when there were more."""
    if len(rows) <= limit:
        return rows, ""
    return rows[:limit], f'<p class="note">Showing the first {limit} rows only.</p>'


def refusal(message: str) -> str:
    return f'<p class="error">{esc(message)}</p>'


def button(action: str, label: str, csrf: str, **fields: object) -> str:
    """A POST form of hidden fields and one button."""
    hidden = "".join(
        f'<input type="hidden" name="{esc(name)}" value="{esc(value)}">'
        for name, value in {"csrf": csrf, **fields}.items()
    )
    return (
        f'<form method="post" action="{esc(url(action))}">{hidden}'
        f"<button>{esc(label)}</button></form>"
    )


def layout(title: str, body: str, session: WebSession | None, here: str = "") -> str:
    nav = ""
    if session is not None:
        links = " ".join(
            f'<a href="{esc(url(path))}"{" class=here" if path == here else ""}>{esc(label)}</a>'
            for path, label in NAV
        )
        flash = "".join(f'<p class="{esc(kind)}">{esc(text)}</p>' for kind, text in session.flash)
        session.flash.clear()
        logout = button("logout", "Log out", session.csrf)
        nav = f'{links}<span class="who">{esc(session.user)}</span>{logout}'
        body = flash + body
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)} · ssb</title>"
        f'<link rel="stylesheet" href="{ROOT}/static/dashboard.css">'
        f'<link rel="icon" href="{ROOT}/static/icon.svg" type="image/svg+xml">'
        f"</head><body><header><strong>ssb</strong>{nav}</header>"
        f"<main><h1>{esc(title)}</h1>{body}</main></body></html>"
    )


def queue_status(row: Mapping[str, Any]) -> tuple[str, str]:
    """(ON / OFF / disabled, why) of a `service_queues` row."""
    if row.get("is_receive_enabled"):
        return "ON", ""
    reason = row.get("disabled_reason")
    return ("disabled", str(reason)) if reason else ("OFF", "")


def enable_button(status: str, queue: object, session: WebSession) -> str:
    """ "Enable" for a queue that is off or disabled."""
    return "" if status == "ON" else button("enable-queue", "Enable", session.csrf, queue=queue)


def monitor_text(monitor: Mapping[str, Any] | None) -> str:
    if monitor is None:
        return '<span class="note">no activation</span>'
    text = (
        f"{monitor.get('activation')} {monitor.get('state')}:"
        f" {monitor.get('tasks_running')}/{monitor.get('max_queue_readers')} tasks,"
        f" {monitor.get('tasks_waiting')} waiting"
    )
    error = monitor.get("last_task_error")
    return esc(text) + (f'<br><span class="error">{esc(error)}</span>' if error else "")


def page_response(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", headers=HEADERS)


def redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={**HEADERS, "Location": location})


def forbidden(reason: str) -> web.Response:
    return page_response(layout("Refused", refusal(reason), None), status=403)


def login_page(target: str, error: str) -> str:
    form = (
        f'<form class="login" method="post" action="{esc(url("login"))}">'
        f'<input type="hidden" name="next" value="{esc(target)}">'
        '<label>Login <input name="user" autocomplete="username" required></label>'
        '<label>Password <input name="password" type="password"'
        ' autocomplete="current-password" required></label>'
        "<button>Log in</button></form>"
    )
    return layout("Log in", (refusal(error) if error else "") + form, None)


def form_field(form: MultiDictProxy[Any], name: str) -> str:
    value = form.get(name)
    return value[:MAX_NAME] if isinstance(value, str) else ""


def whole_number(value: str | None) -> int | None:
    """A whole number (0 or more) from a query or a form, else None."""
    if value is None or not value.isascii() or not value.isdigit() or len(value) > 18:
        return None
    return int(value)


def local_target(target: str | None) -> str:
    """Where to go after logging in: a dashboard path, never another site."""
    if (
        target
        and target.startswith(f"{ROOT}/")
        and "\\" not in target
        and not any(c < " " for c in target)
    ):
        return target
    return url("queues")
