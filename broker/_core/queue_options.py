"""A queue's options, parsed and checked: STATUS, RETENTION, ACTIVATION, poison message
handling (with ssb's poison policy) and quotas.

Each parser takes what a client sent (a string ON / OFF, a map, a number) and returns the
option's frozen record, or raises a clear error naming what was wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .._errors import bad_argument
from .names import MAX_LOGIN_NAME, is_login_name, plain


@dataclass(frozen=True, slots=True)
class Activation:
    """ACTIVATION: `procedure` is a Python `package.module:function`, or the key of a
    T-SQL stored procedure of the queue's database (see `is_python`)."""

    status: bool = False
    procedure: str = ""
    max_queue_readers: int = 1
    execute_as: str = ""  # the login it runs as; "": the queue's owner


@dataclass(frozen=True, slots=True)
class PoisonPolicy:
    threshold: int
    action: str  # dead_letter | end_conversation | park | record
    dead_letter_queue: str | None = None
    delay: float = 60.0
    max_parks: int = 3
    notify_service: str | None = None
    error_code: int = 500
    description: str = ""


MAX_QUOTA: Final = 1 << 62


def parse_quota(what: str, value: object) -> int | None:
    """A queue quota: None (no limit) or an integer 1..2**62."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_QUOTA:
        raise bad_argument(
            f"{what} must be a whole number >= 1, or None for no limit; got {value!r}"
        )
    return value


def parse_switch(what: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.upper() in ("ON", "OFF"):
        return value.upper() == "ON"
    raise bad_argument(f"{what} must be 'ON' or 'OFF', got {value!r}")


def parse_activation(value: object, current: Activation = Activation()) -> Activation:
    if value is None:
        return current
    if not isinstance(value, dict):
        raise bad_argument("activation must be a map with status, procedure, max_queue_readers")
    unknown = set(value) - {"status", "procedure", "max_queue_readers", "execute_as"}
    if unknown:
        raise bad_argument(f"unknown activation option(s): {', '.join(sorted(unknown))}")
    status = parse_switch("activation status", value.get("status", current.status))
    procedure = value.get("procedure", current.procedure)
    if not isinstance(procedure, str) or len(procedure) > 1024:
        raise bad_argument(
            "activation procedure must be 'package.module:function' (Python) or the name of"
            " a T-SQL stored procedure"
        )
    if procedure and (plain(procedure).startswith(":") or not plain(procedure).strip()):
        raise bad_argument(
            f"activation procedure {plain(procedure)!r} must be written"
            " 'package.module:function' (Python) or name a T-SQL stored procedure"
        )
    if status and not procedure:
        raise bad_argument(
            "activation STATUS = ON needs a procedure ('package.module:function' or a T-SQL"
            " stored procedure's name)"
        )
    readers = value.get("max_queue_readers", current.max_queue_readers)
    if not isinstance(readers, int) or isinstance(readers, bool) or not 0 <= readers <= 32767:
        raise bad_argument(f"max_queue_readers must be an integer 0..32767, got {readers!r}")
    execute_as = value.get("execute_as", current.execute_as)
    if "execute_as" in value:  # (whether the login exists, the caller checks)
        # None or "" (None's spelling in clients before 0.2): the queue's owner
        if execute_as not in (None, "") and not is_login_name(execute_as):
            raise bad_argument(
                f"activation execute_as must be a login's name (1..{MAX_LOGIN_NAME} letters,"
                f" digits, '_', '-' or '.'), or None for the queue's owner; got {execute_as!r}"
            )
        execute_as = execute_as or ""
    return Activation(status, procedure, readers, execute_as)


_POISON_ACTIONS: Final = ("dead_letter", "end_conversation", "park", "record")
_MAX_DELAY: Final = 366 * 24 * 3600.0  # as any other wait (a year and a day)
_MAX_COUNT: Final = 2**31 - 1  # threshold and max_parks
_MAX_DESCRIPTION: Final = 4000  # as END CONVERSATION's description


def parse_poison_policy(value: object) -> PoisonPolicy | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_argument("poison_policy must be a map with threshold and action")
    known = {f for f in PoisonPolicy.__dataclass_fields__}
    unknown = set(value) - known
    if unknown:
        raise bad_argument(f"unknown poison_policy option(s): {', '.join(sorted(unknown))}")
    threshold = _count(value, "threshold", None, 1)
    action = value.get("action")
    if action not in _POISON_ACTIONS:
        raise bad_argument(f"poison_policy action must be one of {', '.join(_POISON_ACTIONS)}")
    dead_letter_queue = _optional_name(value, "dead_letter_queue")
    if action == "dead_letter" and dead_letter_queue is None:
        raise bad_argument("poison_policy action 'dead_letter' needs dead_letter_queue")
    delay = value.get("delay", 60.0)
    if (
        isinstance(delay, bool)
        or not isinstance(delay, (int, float))
        or not 0 <= delay <= _MAX_DELAY  # NaN fails this too
    ):
        raise bad_argument(
            f"poison_policy delay must be a number of seconds from 0 to {_MAX_DELAY:g},"
            f" got {delay!r}"
        )
    error_code = value.get("error_code", 500)
    if (
        isinstance(error_code, bool)
        or not isinstance(error_code, int)
        or error_code == 0
        or not -(2**31) <= error_code < 2**31
    ):
        raise bad_argument(
            f"poison_policy error_code must be a non-zero integer that fits in 32 bits,"
            f" got {error_code!r}"
        )
    description = value.get("description", "")
    if not isinstance(description, str) or len(description) > _MAX_DESCRIPTION:
        raise bad_argument(
            f"poison_policy description must be a text of at most {_MAX_DESCRIPTION} characters"
        )
    return PoisonPolicy(
        threshold=threshold,
        action=action,
        dead_letter_queue=dead_letter_queue,
        delay=float(delay),
        max_parks=_count(value, "max_parks", 3, 0),
        notify_service=_optional_name(value, "notify_service"),
        error_code=error_code,
        description=description,
    )


def _count(policy: dict[object, object], option: str, default: int | None, low: int) -> int:
    """A poison_policy option that counts (`default`: None when it must be given)."""
    number = policy.get(option, default)
    if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= _MAX_COUNT:
        raise bad_argument(
            f"poison_policy {option} must be an integer from {low} to {_MAX_COUNT}, got {number!r}"
        )
    return number


def _optional_name(policy: dict[object, object], option: str) -> str | None:
    """A poison_policy option naming an object, if given (its existence is checked later)."""
    name = policy.get(option)
    if name is not None and not isinstance(name, str):
        raise bad_argument(f"poison_policy {option} must be a name, got {name!r}")
    return name


def is_python(procedure: str) -> bool:
    """Whether an activation procedure is Python (`module:function`); else it is T-SQL."""
    return ":" in procedure
