"""A real PostgreSQL server for the tests, started once per test session.

`PostgresServer(root).start()` makes a cluster with `initdb` in `root` (owned by the
unprivileged `postgres` user when the tests run as root: the server refuses to run as
root), starts it with `pg_ctl` on a free loopback port with its Unix socket in `root`,
and `stop()` stops it. `fresh_database(server_url)` creates an empty database and
returns its URL. Local connections are trusted: the server listens on 127.0.0.1 only,
for the length of a test session.

The fixture `postgres_server` (tests/conftest.py) is that server, started on first use
and stopped at the end of the session. When the daemon tests run on PostgreSQL (`pytest
--store postgresql`), `DATABASE_ENV` holds its URL and every `BrokerProcess` gets a
database of its own (see tests/daemon.py).

`initdb`, `pg_ctl` and `postgres` come from the PATH or from Debian's
/usr/lib/postgresql/<version>/bin; without them the PostgreSQL tests fail with
`PostgresMissing`, whose message says what to install.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from ssb import tools

SERVER_USER = "postgres"  # the unprivileged user that owns and runs the cluster (as root)
START_TIMEOUT = 60  # seconds pg_ctl waits for the server to accept connections
DATABASE_ENV = "SSB_TEST_POSTGRES"  # the server's URL when daemons run on PostgreSQL
_names = itertools.count(1)
_DEBIAN_BIN = Path("/usr/lib/postgresql")


class PostgresMissing(RuntimeError):
    """PostgreSQL cannot be started here (the message says what to install)."""


def _binaries() -> Path:
    """The directory holding initdb and pg_ctl."""
    found = shutil.which("initdb")
    if found is not None and shutil.which("pg_ctl") is not None:
        return Path(found).resolve().parent
    versions = sorted(_DEBIAN_BIN.glob("*/bin/initdb"), key=lambda p: p.parent.parent.name)
    if versions:
        return versions[-1].parent
    raise PostgresMissing(
        "the PostgreSQL tests need a PostgreSQL server (initdb, pg_ctl, postgres) and none"
        " was found on the PATH or in /usr/lib/postgresql; on Debian/Ubuntu: sudo apt-get"
        " install postgresql (scripts/test.sh installs it when run as root)"
    )


class PostgresServer:
    """One PostgreSQL cluster in a directory of its own, on 127.0.0.1."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "cluster"
        self.sockets = root / "sockets"
        self.port = 0
        self.user = SERVER_USER
        self._bin = _binaries()
        self._running = False

    @property
    def url(self) -> str:
        """The server's URL, without a database (append one)."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self._bin / args[0]), *args[1:]]
        if os.geteuid() == 0:  # the server refuses to run as root
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=START_TIMEOUT + 30)

    def start(self) -> PostgresServer:
        self.root.mkdir(parents=True, exist_ok=True)
        self.sockets.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise PostgresMissing(
                    f"the PostgreSQL tests run the server as the user {SERVER_USER!r}, and there"
                    " is none; on Debian/Ubuntu the postgresql package makes it"
                ) from None
            for path in (self.root, self.sockets):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        else:
            self.user = pwd.getpwuid(os.geteuid()).pw_name
        made = self._run(
            "initdb", "-D", str(self.data), "-U", self.user, "--auth=trust", "--no-locale",
            "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        if made.returncode != 0:
            raise PostgresMissing(f"initdb failed:\n{made.stdout}\n{made.stderr}")
        self.port = tools.free_port()
        options = (
            f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1"
            " -c max_connections=300 -c shared_buffers=64MB"
        )
        started = self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", options,
            "-w", "-t", str(START_TIMEOUT), "start",
        )  # fmt: skip
        if started.returncode != 0:
            log = (self.root / "server.log").read_text(errors="replace")[-3000:]
            raise PostgresMissing(f"PostgreSQL did not start:\n{started.stderr}\n{log}")
        self._running = True
        return self

    def stop(self) -> None:
        if self._running:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            self._running = False


def fresh_database(server_url: str) -> str:
    """A new, empty database on the server of `server_url` (no database in it); its URL."""
    import psycopg

    name = f"ssb_test_{os.getpid()}_{next(_names)}"
    with psycopg.connect(f"{server_url}/postgres", autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{name}"')
    return f"{server_url}/{name}"
