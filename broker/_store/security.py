"""Who may do what: the `logins`, `grants` and `owners` tables.

Theory of operation. A login is a name and a salted scrypt hash, never a password (see
`broker/_logins.py`); a grant is a permission of a login on an object (kind and name,
both '' for the broker itself); every catalog object has one owner (see
`broker/_permissions.py`). These tables are small and read whole when the broker starts;
changes are written in the open batch like any other.
"""

from __future__ import annotations

from typing import Final

from .._core.ports import Row
from .commit import Tables
from .port import GRANT_COLUMNS, LOGIN_COLUMNS, OWNER_COLUMNS
from .sql import columns, insert_new, upsert

_PUT_LOGIN: Final = upsert("logins", LOGIN_COLUMNS, ("name",))
_DELETE_LOGIN: Final = "DELETE FROM logins WHERE name = ?"
_PUT_GRANT: Final = insert_new("grants", GRANT_COLUMNS, GRANT_COLUMNS)
_DELETE_GRANT: Final = (
    "DELETE FROM grants WHERE login = ? AND permission = ? AND kind = ? AND name = ?"
)
_PUT_OWNER: Final = upsert("owners", OWNER_COLUMNS, ("kind", "name"))
_FORGET_OWNER: Final = "DELETE FROM owners WHERE kind = ? AND name = ?"
_FORGET_GRANTS_ON: Final = "DELETE FROM grants WHERE kind = ? AND name = ?"
_FORGET_GRANTS_TO: Final = "DELETE FROM grants WHERE login = ?"


class SecurityTables(Tables):
    """The `logins` (LOGIN_COLUMNS), `grants` (GRANT_COLUMNS) and `owners`
    (OWNER_COLUMNS) tables."""

    def load_logins(self) -> list[tuple[str, str, float]]:
        return self._db.execute(f"SELECT {columns(LOGIN_COLUMNS)} FROM logins").fetchall()

    def put_login(self, row: Row) -> None:
        """(name, hash, created)"""
        self._add(_PUT_LOGIN, row)

    def delete_login(self, name: str) -> None:
        self._add(_DELETE_LOGIN, (name,))

    def load_permissions(self) -> tuple[list[Row], list[Row]]:
        """(grants, owners) rows."""
        db = self._db
        grants = db.execute(f"SELECT {columns(GRANT_COLUMNS)} FROM grants").fetchall()
        return grants, db.execute(f"SELECT {columns(OWNER_COLUMNS)} FROM owners").fetchall()

    def put_grant(self, row: Row) -> None:
        """(login, permission, kind, name); kind and name '' for the broker itself"""
        self._add(_PUT_GRANT, row)

    def delete_grant(self, row: Row) -> None:
        self._add(_DELETE_GRANT, row)

    def put_owner(self, row: Row) -> None:
        """(kind, name, login)"""
        self._add(_PUT_OWNER, row)

    def forget_object(self, kind: str, name: str) -> None:
        """A dropped object's owner and the permissions granted on it."""
        self._add(_FORGET_OWNER, (kind, name))
        self._add(_FORGET_GRANTS_ON, (kind, name))

    def forget_login(self, login: str) -> None:
        self._add(_FORGET_GRANTS_TO, (login,))
