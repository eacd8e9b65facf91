"""Real broker daemons as subprocesses on 127.0.0.1, for tests and benchmarks.

`BrokerProcess` starts `python -m broker serve` on free ports (port 0), reads the
`ssb ready ...` line to learn them, and can stop it with SIGTERM, kill it with
SIGKILL (kill -9) and start it again on the same data directory.
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
from typing import Any
from urllib.parse import quote

READY_TIMEOUT = 30.0
# what the tests' and benchmarks' brokers may run (the operator's `procedures` list)
TEST_PROCEDURES = [
    "activation_procs:*",
    "spark_funcs:*",
    "myprocs:*",
    "bench.*",
    "time:sleep",
    "operator:truediv",
]


class BrokerProcess:
    def __init__(
        self,
        data_dir: Path,
        durability: str = "fsync",
        config: dict[str, Any] | None = None,
        extra_args: list[str] | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.durability = durability
        self.config = config
        self.extra_args = extra_args or []
        self.cwd = cwd
        self.env = env  # added to the daemon's environment
        self.http_url = ""  # http://HOST:PORT when the HTTP port is on
        self.proc: subprocess.Popen[bytes] | None = None
        self.client_port = 0
        self.broker_port: int | None = None
        self.instance = ""
        self.tls_fingerprint = ""
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"

    @property
    def url(self) -> str:
        """The admin login's URL (its password is the one the first start wrote)."""
        return self.url_for("admin", self.admin_password())

    def url_for(self, user: str, password: str, *, tls: bool = False) -> str:
        """A login's URL; with `tls`, ssbs:// pinned to the broker's certificate."""
        credentials = f"{quote(user, safe='')}:{quote(password, safe='')}"
        if not tls:
            return f"ssb://{credentials}@127.0.0.1:{self.client_port}"
        pin = f"?fingerprint={self.tls_fingerprint}"
        return f"ssbs://{credentials}@127.0.0.1:{self.client_port}{pin}"

    @property
    def tls_url(self) -> str:
        return self.url_for("admin", self.admin_password(), tls=True)

    def admin_password(self) -> str:
        return (self.data_dir / "admin.password").read_text().strip()

    def _config_file(self) -> list[str]:
        # a test machine may have less free disk than the 1 GiB default guard: tests that
        # are about free space set min_free_disk themselves
        settings = {"min_free_disk": 0, "procedures": TEST_PROCEDURES, **(self.config or {})}
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

    def start(self) -> BrokerProcess:
        # reuse the ports a previous run got, so clients can reconnect after a restart
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
            *self._config_file(),
            *self.extra_args,
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        env = None if self.env is None else {**os.environ, **self.env}
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=log, cwd=self.cwd, env=env
        )
        log.close()
        line = self._read_ready()
        fields = dict(part.split("=", 1) for part in line.split()[2:])
        self.client_port = int(fields["client"].rsplit(":", 1)[1])
        if "broker" in fields:
            self.broker_port = int(fields["broker"].rsplit(":", 1)[1])
        self.instance = fields["instance"]
        self.tls_fingerprint = fields.get("tls", "")
        self.http_url = fields.get("http", "")
        return self

    def _read_ready(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT
        buffer = b""
        fd = self.proc.stdout.fileno()
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:  # earlier lines: e.g. where the admin password is
                    raw, buffer = buffer.split(b"\n", 1)
                    line = raw.decode()
                    if line.startswith("ssb ready"):
                        return line
            elif self.proc.poll() is not None:
                break
        self.kill()
        raise RuntimeError(
            f"broker did not start; log:\n{self.log_path.read_text(errors='replace')[-4000:]}"
        )

    def kill(self) -> None:
        """kill -9: no clean shutdown at all."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit code."""
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
        return self.proc.returncode

    def restart(self) -> BrokerProcess:
        self.kill()
        return self.start()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def run_ssb(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """`python -m ssb.broker ARGS` (after `prefix`, e.g. a wrapper), run to its end."""
    return subprocess.run(
        [*prefix, sys.executable, "-m", "ssb.broker", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


def serve_once(
    data_dir: Path, *args: str, prefix: tuple[str, ...] = (), timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """`ssb serve` on `data_dir`, on any free ports unless `args` give them, run to its
    end (a start-up that fails)."""
    ports = ("--client-port", "0") if "--client-port" not in args else ()
    return run_ssb(
        "serve",
        "--data-dir",
        str(data_dir),
        *ports,
        "--broker-port",
        "0",
        *args,
        prefix=prefix,
        timeout=timeout,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a command that failed as a mistake should."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]
