"""Names a client gives are names in its session's database: qualified at the client port.

Theory of operation. The core keys the objects of a database by qualified names (see
`_core.names`). A client names them plainly, in the database its session uses (USE, or
`connect(database=...)`), as a T-SQL script does. So before an operation runs (and
before its permissions are checked) `Namespaces.qualify` rewrites, per operation, the
arguments that name objects of the session's database: `QUALIFIED` lists them with
their kind (system objects and names of other brokers' services stay as they are; a
procedure's name takes the spelling it was created with, since procedures are named
without case). In `master` a name is its own key, so a program that knows no databases
runs as it always did; in any database a name holding the separator is refused.

What goes back is plain again: views show a `database` column beside plain names,
RECEIVE's columns are plain, and `shown` rewrites the keys an error's words may hold
(`name` in the session's own database, `database.name` in another).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from ._core.catalog import IN_DATABASE, Catalog
from ._core.names import DEFAULT_DATABASE, SEPARATOR, qualify
from ._core.queue_options import is_python
from ._core.transactions import Session
from ._errors import bad_argument

# argument -> the kind of object it names ("kinds" per operation)
_QUEUE_OPTIONS: Final = {"name": "queue", "activation": "activation", "poison_policy": "policy"}
_PRIORITY: Final = {
    "name": "broker_priority",
    "contract": "contract or ANY",
    "local_service": "service or ANY",
}
QUALIFIED: Final[Mapping[str, Mapping[str, str]]] = {
    "create_message_type": {"name": "message_type"},
    "alter_message_type": {"name": "message_type"},
    "create_contract": {"name": "contract", "messages": "message_types"},
    "create_queue": _QUEUE_OPTIONS,
    "alter_queue": _QUEUE_OPTIONS,
    "create_service": {"name": "service", "queue": "queue", "contracts": "contracts"},
    "alter_service": {
        "name": "service",
        "queue": "queue",
        "add_contracts": "contracts",
        "drop_contracts": "contracts",
    },
    "create_broker_priority": _PRIORITY,
    "alter_broker_priority": _PRIORITY,
    "create_event_notification": {"name": "event_notification", "queue": "queue"},
    "create_procedure": {"name": "procedure"},
    "alter_procedure": {"name": "procedure"},
    "procedure": {"name": "procedure"},
    "begin_dialog": {"from_service": "service", "contract": "contract"},
    "send": {"message_type": "message_type"},
    "receive": {"queue": "queue"},
    "get_conversation_group": {"queue": "queue"},
    "requeue_dead_letter": {"queue": "queue"},
    "register_task": {"queue": "queue"},
    "request_stop": {"queue": "queue"},
    "drop": {"name": "by kind"},
    "grant": {"name": "by kind"},
    "revoke": {"name": "by kind"},
    "view": {"name": "view"},
}
_DATABASE_PART: Final = re.compile(rf"([A-Za-z_@#][A-Za-z0-9_@#$]*){SEPARATOR}")


class Namespaces:
    """Qualifies what a session names, and shows keys back to it."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def qualify(self, session: Session, operation: str, arguments: dict[str, Any]) -> None:
        """Rewrite, in place, the arguments of `operation` that name objects of the
        session's database."""
        spec = QUALIFIED.get(operation)
        if spec is None:
            return
        database = session.database
        for argument, kind in spec.items():
            value = arguments.get(argument)
            if value is None:
                continue
            if kind == "by kind":
                named = arguments.get("kind")
                if not isinstance(named, str) or named not in IN_DATABASE:
                    _check(value)  # the broker's own objects: plain names
                    continue
                kind = str(named)
            qualified = self._qualify(database, kind, value)
            if qualified is not value:
                arguments[argument] = qualified

    def _qualify(self, database: str, kind: str, value: object) -> object:
        if kind == "view":
            if isinstance(value, str) and value.startswith("queue:"):
                return "queue:" + self._name(database, "queue", value[len("queue:") :])
            return value
        if kind in ("contracts", "message_types"):
            single = "contract" if kind == "contracts" else "message_type"
            if isinstance(value, dict):
                return {self._name(database, single, k): v for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [self._name(database, single, v) for v in value]
            return value
        if kind == "activation":
            procedure = value.get("procedure") if isinstance(value, dict) else None
            if isinstance(procedure, str) and procedure and not is_python(procedure):
                return {**value, "procedure": self._name(database, "procedure", procedure)}  # type: ignore[dict-item]
            return value
        if kind.endswith(" or ANY"):
            if isinstance(value, str) and value.upper() == "ANY":
                return value
            kind = kind.partition(" ")[0]
        if kind == "policy":
            queue = value.get("dead_letter_queue") if isinstance(value, dict) else None
            if isinstance(queue, str):
                return {**value, "dead_letter_queue": self._name(database, "queue", queue)}  # type: ignore[dict-item]
            return value
        return self._name(database, kind, value)

    def _name(self, database: str, kind: str, value: object) -> Any:
        if not isinstance(value, str):
            return value  # the operation says what is wrong with it
        _check(value)
        if kind == "procedure":  # named without case: the spelling it was created with
            key = qualify(database, value)
            found = self.catalog.find_procedure(key)
            return key if found is None else found.name
        return self.catalog.key_in(kind, value, database)

    @staticmethod
    def shown(session: Session | None, message: str) -> str:
        """`message` as the session sees it: keys of objects named in their database's
        terms (plain in its own database, `database.name` in another)."""
        if SEPARATOR not in message:
            return message
        database = DEFAULT_DATABASE if session is None else session.database
        folded = database.casefold()

        def part(match: re.Match[str]) -> str:
            owner = match.group(1)
            return "" if owner.casefold() == folded else f"{owner}."

        return _DATABASE_PART.sub(part, message).replace(SEPARATOR, "")


def _check(value: object) -> None:
    if isinstance(value, str) and SEPARATOR in value:
        raise bad_argument(f"a name may not hold control characters, got {value!r}")
