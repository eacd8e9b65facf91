"""`ssb backup`: a consistent copy of a broker's data directory, taken while it runs.

Theory of operation. A broker is its store (`broker.db`) and the files its first start
made beside it: its identity (the broker key and certificate, a staged next pair, the
previous keys that still unwrap session keys peers wrapped for them), the client port's
TLS certificate and key, and `admin.password`. A copy of all of them starts as the same
broker: the same instance id, catalog, messages, logins and certificates.

The store makes the copy of itself (`_store.copy_store`): the store as it was after one
commit, whatever the daemon writes meanwhile, and nothing in the store changes. The
daemon answers a request only once its effects are committed, so everything it had
acknowledged before the copy began is in the copy.

Then every other regular file at the top of the data directory is copied, except what
belongs to one running daemon (`LOCK`, `broker.json`) and the store's own files (the
copy of the store has read them already). The files come after
the store: a certificate rotated in between only adds keys (the previous ones are kept),
so the copied keys unwrap every session key the copied store holds. A TLS certificate
the config names outside the data directory is not copied.

The copy is private (files 0600, a new directory 0700), synced to disk before `backup`
returns, and never overwrites: the target must be new or empty. A backup that fails
removes what it wrote.

A broker whose store is a PostgreSQL database is not copied: its database is backed up
with PostgreSQL's own tools, which copy a live database consistently (`backup` says so);
it holds the files of the data directory too (see `_broker_files`).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ._store import RESERVE_FILE, STORE_FILE, STORE_FILES, StoreError, copy_store

# not copied as files: the store's own files (its copy reads through them) and a running
# daemon's own files
# (the disk reserve is room, not state: the restored broker makes its own)
NOT_COPIED: Final = STORE_FILES | {"LOCK", "broker.json", RESERVE_FILE, f"{RESERVE_FILE}.new"}
ON_POSTGRESQL: Final = (
    "this broker keeps its state in a PostgreSQL database, which `ssb backup` does not"
    " copy: back the database up with PostgreSQL's own tools (pg_dump for a copy of it,"
    " pg_basebackup with WAL archiving for the whole server and recovery to a point in"
    " time); the database holds the whole broker, its keys, certificates and"
    " admin.password included"
)


class BackupError(Exception):
    """The backup cannot be made; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Copied:
    """One file of the backup: its name in the target directory and its size in bytes."""

    name: str
    size: int


def backup(data_dir: Path, target: Path, store: str | None = None) -> list[Copied]:
    """Copy the broker of `data_dir`, running or stopped, into the directory `target`.

    Args:
        data_dir: the broker's data directory (`--data-dir` of its `ssb serve`).
        target: a directory that does not exist yet, or is empty.
        store: the broker's `store` setting (None: its SQLite store in `data_dir`).

    Returns:
        What was copied, the store first.

    Raises:
        BackupError: the store is a PostgreSQL database (the message says how to back it
            up), `data_dir` holds no store, `target` is not new or empty, or a file could
            not be read or written (nothing is left in `target` then).
    """
    source = data_dir / STORE_FILE
    if store is not None or (not source.is_file() and _serves_from_postgresql(data_dir)):
        raise BackupError(ON_POSTGRESQL)
    if not source.is_file():
        raise BackupError(
            f"{data_dir} holds no broker store ({STORE_FILE}); --data-dir names the data"
            " directory of the broker to back up (a broker whose store is a PostgreSQL"
            " database keeps none there: back its database up with pg_dump)"
        )
    made = _prepare(target)
    written: list[Path] = []
    try:
        written.append(target / STORE_FILE)
        copied = [Copied(STORE_FILE, _copy_store(source, target / STORE_FILE))]
        for path in sorted(data_dir.iterdir()):
            if path.name in NOT_COPIED or not path.is_file():
                continue
            written.append(target / path.name)
            copied.append(Copied(path.name, _copy_file(path, target / path.name)))
        _sync_directory(target)
    except BaseException:
        if made:
            shutil.rmtree(target, ignore_errors=True)
        else:
            for path in written:
                path.unlink(missing_ok=True)
        raise
    return copied


def _serves_from_postgresql(data_dir: Path) -> bool:
    """Whether the daemon running on `data_dir` said (in broker.json) that its store is a
    PostgreSQL database."""
    try:
        info = json.loads((data_dir / "broker.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("store") == "postgresql"


def _prepare(target: Path) -> bool:
    """Check that `target` is new or empty, and make it if new (returned: made)."""
    if target.exists():
        if not target.is_dir():
            raise BackupError(f"{target} is a file; name a new or empty directory to back up into")
        if any(target.iterdir()):
            raise BackupError(
                f"{target} is not empty; name a new or empty directory (a backup never"
                " overwrites anything)"
            )
        return False
    try:
        target.mkdir(mode=0o700, parents=True)
    except OSError as exc:
        raise BackupError(f"cannot create {target}: {exc.strerror or exc}") from None
    return True


def _copy_store(source: Path, target: Path) -> int:
    """The store's copy of itself at `source` into a new file `target`; its size."""
    # made first so that the store writes into a file that is private from the start
    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        copy_store(source, target)
    except StoreError as exc:
        raise BackupError(f"cannot copy the store {source}: {exc}") from None
    _sync_file(target)
    return target.stat().st_size


def _copy_file(source: Path, target: Path) -> int:
    """Copy one file into a new private file and sync it; its size."""
    try:
        data = source.read_bytes()
        with open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
    except OSError as exc:
        raise BackupError(f"cannot copy {source} to {target}: {exc.strerror or exc}") from None
    return len(data)


def _sync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_directory(path: Path) -> None:
    """Make the new files' names durable too."""
    _sync_file(path)
