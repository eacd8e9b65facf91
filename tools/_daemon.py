"""A broker daemon as a child process on 127.0.0.1, for tests, benchmarks, examples and scripts.

`BrokerProcess` runs `python -m ssb.broker serve` on free ports (port 0), with a config file
written from a dict, and learns its ports, instance id and certificate from the one line the
daemon prints when it is ready (`ssb ready client=... broker=... instance=...`). It can stop
it (SIGTERM, as a service manager does), kill it (SIGKILL: kill -9, no clean shutdown at all)
and start it again on the same data directory and the same ports, so clients can reconnect.
Its URL carries the admin login with the password the first start wrote into the data
directory. The daemon's stderr goes to a log file beside the data directory.

Daemons given one PostgreSQL database (`store`) are one broker: the first to take its
lease serves, the others wait as standbys and print `ssb standby ...` instead; `start`
takes either line, `role` says which came, and `wait_active` waits for a standby's
ready line once it has taken over.

`read_ready_line` is the wait for such a line, for any command that prints one.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar, Final, Self
from urllib.parse import quote

from ._ports import free_port

READY_TIMEOUT: Final = 30.0
PORT_ATTEMPTS: Final = 3  # starts of a daemon whose picked ports were taken meanwhile
PORT_TAKEN: Final = "Address already in use"  # (what the daemon says, from the system)


def read_ready_line(
    proc: subprocess.Popen[bytes], prefix: str | tuple[str, ...], timeout: float
) -> str | None:
    """Read `proc`'s stdout until a line that starts with `prefix` (or one of several),
    and return that line;
    None when the process closes its stdout or exits first, or after `timeout` seconds.

    Earlier lines (such as where the first start wrote the admin password) are passed over.
    """
    assert proc.stdout is not None, "start the process with stdout=subprocess.PIPE"
    deadline = time.monotonic() + timeout
    buffer = b""
    fd = proc.stdout.fileno()
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            buffer += chunk
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                line = raw.decode(errors="replace")
                if line.startswith(prefix):
                    return line
        elif proc.poll() is not None:
            return None
    return None


class BrokerProcess:
    """One broker daemon run as a child process.

    Args:
        data_dir: its data directory (made on the first start; the log and the config
            file are written beside it).
        durability: "fsync" or "os".
        config: settings for its config file, `[section]`s as nested dicts; they are laid
            over the class's `defaults`.
        extra_args: more arguments for `ssb serve`.
        store: a PostgreSQL URL for `--store` (None: the SQLite store in `data_dir`).
        cwd, env: the daemon's working directory, and variables added to its environment.
    """

    # settings every daemon of this class gets (a subclass names its own)
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(
        self,
        data_dir: Path,
        durability: str = "fsync",
        config: dict[str, Any] | None = None,
        extra_args: list[str] | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        store: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.store = store
        self.durability = durability
        self.config = config
        self.extra_args = extra_args or []
        self.cwd = cwd
        self.env = env
        self.http_url = ""  # http://HOST:PORT when the HTTP port is on
        self.proc: subprocess.Popen[bytes] | None = None
        self.client_port = 0
        self.broker_port: int | None = None
        self.instance = ""
        self.node = ""
        self.role = ""  # "active" or "standby", as the daemon's last line said
        self.tls_fingerprint = ""
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"

    @property
    def pid(self) -> int:
        """The daemon's process id (0 before its first start)."""
        return self.proc.pid if self.proc is not None else 0

    @property
    def url(self) -> str:
        """The admin login's URL (its password is the one the first start wrote)."""
        return self.url_for("admin", self.admin_password())

    @property
    def tls_url(self) -> str:
        """The admin login's URL over TLS, pinned to the broker's certificate."""
        return self.url_for("admin", self.admin_password(), tls=True)

    def url_for(self, user: str, password: str, *, tls: bool = False) -> str:
        """A login's URL; with `tls`, ssbs:// pinned to the broker's certificate."""
        credentials = f"{quote(user, safe='')}:{quote(password, safe='')}"
        if not tls:
            return f"ssb://{credentials}@127.0.0.1:{self.client_port}"
        pin = f"?fingerprint={self.tls_fingerprint}"
        return f"ssbs://{credentials}@127.0.0.1:{self.client_port}{pin}"

    def admin_password(self) -> str:
        return (self.data_dir / "admin.password").read_text().strip()

    def _config_file(self) -> list[str]:
        settings = {**self.defaults, **(self.config or {})}
        if not settings:
            return []
        path = self.data_dir.parent / f"{self.data_dir.name}.toml"
        lines = []
        sections: dict[str, dict[str, Any]] = {}
        for key, value in settings.items():
            if isinstance(value, dict):
                sections[key] = value
            else:
                lines.append(f"{key} = {json.dumps(value)}")
        for name, body in sections.items():
            lines.append(f"[{name}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in body.items()]
        path.write_text("\n".join(lines) + "\n")
        return ["--config", str(path)]

    def start(self) -> Self:
        """Start the daemon and wait for its ready line (RuntimeError, with the log's
        tail, when it does not come). Ports it picked itself that another process took
        before the daemon could listen are picked again (twice at most)."""
        picked = (not self.client_port, not self.broker_port)
        for attempt in range(PORT_ATTEMPTS):
            # ports it keeps for its restarts, so clients can reconnect to them (below
            # the ephemeral range: see free_port)
            if not self.client_port:
                self.client_port = free_port()
            if not self.broker_port:
                self.broker_port = free_port()
                while self.broker_port == self.client_port:
                    self.broker_port = free_port()
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0  # bytes
            line = self._launch()
            if line is not None:
                self._took(line)
                return self
            self.kill()
            said = self.log_path.read_bytes()[logged:].decode(errors="replace")
            if PORT_TAKEN not in said or not any(picked) or attempt + 1 == PORT_ATTEMPTS:
                raise RuntimeError(f"broker did not start; log:\n{said[-4000:]}")
            if picked[0]:
                self.client_port = 0
            if picked[1]:
                self.broker_port = 0
        raise AssertionError("unreachable")

    def _launch(self) -> str | None:
        """Run the daemon; its ready line (None: it did not print one in time)."""
        args = [
            sys.executable,
            "-m",
            "ssb.broker",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--host",
            "127.0.0.1",
            "--client-port",
            str(self.client_port),
            "--broker-port",
            str(self.broker_port or 0),
            "--durability",
            self.durability,
            *([] if self.store is None else ["--store", self.store]),
            *self._config_file(),
            *self.extra_args,
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        env = None if self.env is None else {**os.environ, **self.env}
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=log, cwd=self.cwd, env=env
        )
        log.close()
        return read_ready_line(self.proc, ("ssb ready", "ssb standby"), READY_TIMEOUT)

    def wait_active(self, timeout: float = READY_TIMEOUT) -> Self:
        """Wait until this standby has taken over and prints its ready line (RuntimeError,
        with the log's tail, when it does not within `timeout` seconds)."""
        assert self.proc is not None
        if self.role == "active":
            return self
        line = read_ready_line(self.proc, "ssb ready", timeout)
        if line is None:
            raise RuntimeError(f"the standby did not take over; log:\n{self.log_text()[-4000:]}")
        self._took(line)
        return self

    def _took(self, line: str) -> None:
        """What a ready or standby line says."""
        fields = dict(part.split("=", 1) for part in line.split()[2:])
        self.instance = fields["instance"]
        self.node = fields.get("node", "")
        self.http_url = fields.get("http", "")
        if line.startswith("ssb standby"):
            self.role = "standby"
            return
        self.role = "active"
        self.client_port = int(fields["client"].rsplit(":", 1)[1])
        if "broker" in fields:
            self.broker_port = int(fields["broker"].rsplit(":", 1)[1])
        self.tls_fingerprint = fields.get("tls", "")

    def freeze(self) -> None:
        """SIGSTOP: the process stops where it is, its connections left open."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT: a frozen process runs again."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """kill -9: no clean shutdown at all."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.role = ""

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit code (SIGKILL, and TimeoutExpired raised,
        when it does not end within `timeout` seconds)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                raise
        self.role = ""
        return self.proc.returncode

    def restart(self) -> Self:
        """kill -9, then start again on the same data directory and ports."""
        self.kill()
        return self.start()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> Self:
        return self if self.proc is not None and self.proc.poll() is None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
