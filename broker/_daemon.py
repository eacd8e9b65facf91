"""Starting and stopping the daemon.

Start: lock the data directory (one daemon per directory), open the store, rebuild
the engine from it, listen on the client port, write `broker.json` (ports, pid,
broker instance) into the data directory and print one `ssb ready ...` line. Stop
(SIGTERM or SIGINT): stop accepting, roll back every open transaction, let the
last batch reach the disk, close. A store failure stops the daemon with exit code 3:
memory would be ahead of disk, and a restart rebuilds from what is durable.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import logging
import os
import signal
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._config import Config, ConfigError
from ._engine import Engine
from ._server import ClientConnection, Operations
from ._store import Store

log = logging.getLogger("ssb.daemon")

EXIT_STORE_FAILURE = 3

# Other subsystems (activation, transport) register start-up hooks here; each gets
# the running Broker and returns an async close function.
StartHook = Callable[["Broker"], Any]
START_HOOKS: list[StartHook] = []


class DataDirLocked(RuntimeError):
    pass


class Broker:
    """A running daemon: store, engine, listeners, and the hooks' services."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.data_dir / "LOCK", "a+")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataDirLocked(
                f"another ssb daemon is using {self.data_dir}; stop it or pick another --data-dir"
            ) from None
        self.store = Store(self.data_dir / "broker.db", config.durability)
        meta = self.store.load_meta()
        instance = meta.get("broker_instance")
        if instance is None:
            instance = str(uuid.uuid4())
            self.store.put_meta("broker_instance", instance)
            self.store.write_now()
        self.engine = Engine(self.store, instance, config.lock_timeout)
        self.engine.load()
        self.operations = Operations(self.engine)
        self.connections: set[ClientConnection] = set()
        self.stopped = asyncio.Event()
        self.exit_code = 0
        self.client_address: tuple[str, int] = (config.host, 0)
        self.broker_address: tuple[str, int] | None = None
        self._server: asyncio.base_events.Server | None = None
        self._closers: list[Callable[[], Any]] = []
        self.extra_info: dict[str, Any] = {}
        self.transport: Any = None  # the broker-to-broker transport, once started

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.store.attach(loop, self._store_failed)
        self.engine.start(loop)
        users = self.config.users
        self._server = await loop.create_server(
            lambda: ClientConnection(self.engine, self.operations, users, self.connections),
            self.config.host,
            self.config.client_port,
        )
        sock = self._server.sockets[0].getsockname()
        self.client_address = (sock[0], sock[1])
        for hook in START_HOOKS:
            closer = await hook(self)
            if closer is not None:
                self._closers.append(closer)
        info = {
            "pid": os.getpid(),
            "broker_instance": self.engine.instance_id,
            "host": self.client_address[0],
            "client_port": self.client_address[1],
            "broker_port": self.broker_address[1] if self.broker_address else None,
            "durability": self.config.durability,
            **self.extra_info,
        }
        (self.data_dir / "broker.json").write_text(json.dumps(info, indent=2))
        broker = f" broker=127.0.0.1:{info['broker_port']}" if self.broker_address else ""
        print(
            f"ssb ready client={self.client_address[0]}:{self.client_address[1]}{broker}"
            f" instance={self.engine.instance_id} data={self.data_dir}",
            flush=True,
        )

    def _store_failed(self, exc: BaseException) -> None:
        log.critical("store commit failed, stopping: %r", exc)
        self.exit_code = EXIT_STORE_FAILURE
        self.stopped.set()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for closer in reversed(self._closers):
            try:
                await closer()
            except Exception:
                log.exception("error while stopping a subsystem")
        for connection in list(self.connections):
            connection.close()
            connection.connection_lost(None)
        if self.store.failed is None:
            await self.store.close()
        (self.data_dir / "broker.json").unlink(missing_ok=True)
        self._lock_file.close()


async def serve(config: Config) -> int:
    broker = Broker(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, broker.stopped.set)
    await broker.start()
    await broker.stopped.wait()
    log.info("stopping")
    await broker.stop()
    return broker.exit_code


def run(config: Config) -> int:
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # uvloop is optional; asyncio's own loop works too
        factory = None
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(serve(config))
    except (DataDirLocked, ConfigError) as exc:
        print(f"ssb: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            print(
                f"ssb: cannot listen: {exc.strerror} ({exc}); stop the other process or pick"
                " other ports with --client-port / --broker-port (0 = any free port)",
                file=sys.stderr,
            )
            return 2
        raise


def _register_subsystems() -> None:
    from ._transport import start_transport

    if start_transport not in START_HOOKS:
        START_HOOKS.insert(0, start_transport)


_register_subsystems()


def data_dir_info(data_dir: Path) -> dict[str, Any]:
    """What a running daemon wrote about itself into its data directory."""
    return dict(json.loads((data_dir / "broker.json").read_text()))


# Subsystems append their start hooks to START_HOOKS when imported; imported last
# because they import this module.
from . import _activation, _leases  # noqa: E402, F401
