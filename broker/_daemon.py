"""Starting and stopping the daemon: the one place that builds and wires everything.

Start, in this order: lock the data directory (one daemon per directory); with a
PostgreSQL store, join the broker's lease and wait as a standby until this daemon takes
it (see `_standby`; several daemons given one database are one broker, and one of them
serves), then keep renewing it; open the store (migrating an older one) and make the
data directory's files of the broker the store's (see `_broker_files`: a standby with
an empty data directory is the same broker); make activation's queue monitors and the
relay to the transport, and build the core from the store with them as its listener and
its sink (the core tells them what happens to queues and what waits for other brokers;
activation and the transport, built later, take them at their own construction); the
store's commit histograms, when the HTTP port is on, before the store commits by
itself; logins, permissions and the operations each part offers (a name offered twice
fails start); listen on the client port; start the broker-to-broker transport; the
views; activation and the scheduler's execution log; write `broker.json` (ports, pid,
broker instance) and print one `ssb ready ...` line. Each part is handed at
construction what it uses (the core's parts or callables, never the whole core);
nothing is attached to a part after it is built, and nothing registers itself at
import.

While running, every SPACE_CHECK seconds (and once at start, before it serves) the
daemon measures the free space for the store (the file system's plus the store's own
free space) and keeps the store's disk reserve in place when there is room, and tells
the core, which refuses new messages below `min_free_disk` or while the reserve is
given up; when the store has been idle a while it runs the store's idle upkeep. A
commit that fails for want of space is retried by the store; one that fails for any
other reason stops the daemon with exit code 3 (memory would be ahead of disk; a
restart rebuilds from what is durable). One that still cannot be written after
`disk_full_timeout` is abandoned by the store: every client whose answer waited for it
is answered DiskFullError (nothing of it was applied), and the broker starts again in
the same process, on the same ports, from what is durable, as after kill -9 (clients
reconnect; open transactions were rolled back), refusing new messages while the disk
is full.

Stop (SIGTERM or SIGINT): stop accepting, roll back every open transaction, let the
last batch reach the disk, close, and give the lease up (a standby takes over at once).
A daemon that may have lost its lease (its own clock says so, a renewal finds another
holder, or the database refuses a commit) closes every client connection at once,
writes nothing more and exits with code 4 (a service manager starts it again: as a
standby).
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import fcntl
import functools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ssb.protocol import WIRE_VERSION, Welcome

from . import _heap, _logging, _systemd
from ._activation.execution_log import ExecutionLog
from ._activation.manager import ActivationManager, ActivationSettings, loopback
from ._activation.monitors import Monitors
from ._activation.workers import WorkerPool
from ._broker_files import BrokerFiles
from ._config import Config, ConfigError
from ._core.engine import CoreLimits, Engine, StoredState
from ._core.names import display
from ._core.ports import Cancellable, OutboundRelay
from ._logins import ADMIN, PASSWORD_FILE, Logins, ThrottleSettings
from ._namespaces import Namespaces
from ._operations import Operations
from ._permissions import Permissions
from ._procedures import ProcedurePolicy
from ._server import SERVER_NAME, ClientConnection, NextRequests
from ._store import (
    CommitHooks,
    Store,
    StoreError,
    StoreUnavailable,
    describe_failure,
    lease_lost,
    open_store,
)
from ._tls import Door, server_context
from ._transport import Transport, TransportSettings
from ._views import Views

if TYPE_CHECKING:
    import ssl

    from ._dashboard import Dashboard
    from ._http import HttpServer
    from ._lease import LeaseKeeper
    from ._metrics import CommitHistograms

log = logging.getLogger("ssb.daemon")

EXIT_STORE_FAILURE: Final = 3
EXIT_CANNOT_START: Final = 2
EXIT_LEASE_LOST: Final = 4
SPACE_CHECK: Final = 1.0  # seconds between free-space measurements
CHECKPOINT_IDLE: Final = 10.0  # seconds without commits before the store's idle upkeep


class DataDirLocked(RuntimeError):
    pass


class LoopClock:
    """The core's Clock on an asyncio loop: wall-clock times, loop timers."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.time: Callable[[], float] = time.time  # no wrapper on the hot path

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        return self.loop.call_later(max(0.0, when - time.time()), callback)

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon(callback)

    def create_future(self) -> asyncio.Future[Any]:
        return self.loop.create_future()


class Broker:
    """A running daemon: store, core, listeners and the parts around them."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.stopped = asyncio.Event()
        self.exit_code = 0
        self.connections: set[ClientConnection] = set()
        self.client_address: tuple[str, int] = (config.host, 0)
        self.http_port = config.http_port  # (a standby's, bound again once active)
        self._serving = False  # started: what changes from now on is an operation's
        self.broker_address: tuple[str, int] | None = None
        self.door: Door | None = None
        self._closers: list[Callable[[], Any]] = []
        self._jobs: set[asyncio.Task[Any]] = set()
        self._unmeasured = 0  # free-space measurements failed in a row
        self._lock_file: Any = None
        self.keeper: LeaseKeeper | None = None  # the lease, with a PostgreSQL store
        self.files: BrokerFiles
        self.store: Store
        self.engine: Engine
        self.transport: Transport | None = None
        self.activation: ActivationManager | None = None
        self.http: HttpServer | None = None
        self.dashboard: Dashboard | None = None
        self.logins: Logins
        self.permissions: Permissions
        self.restart: str | None = None  # why the broker starts again (a commit abandoned)

    # ---- start ------------------------------------------------------------------------

    def _lock_data_dir(self) -> None:
        data_dir = self.data_dir
        if data_dir.exists() and not data_dir.is_dir():
            raise StoreUnavailable(f"--data-dir {data_dir} is a file, not a directory")
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(
                f"cannot create the data directory {data_dir}: {exc.strerror}"
            ) from None
        self._lock_file = open(data_dir / "LOCK", "a+")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            self._lock_file = None
            raise DataDirLocked(
                f"another ssb daemon is using {data_dir}; stop it or pick another --data-dir"
            ) from None

    async def _take_lease(self) -> bool:
        """Join the database's lease and wait as a standby until this daemon holds it
        (False: it was told to stop first); renew it from then on."""
        from ._standby import open_lease, stand_by

        self.keeper = keeper = await open_lease(self.config)
        taken, self.http_port = await stand_by(self.config, keeper, self.stopped)
        if taken:
            keeper.start(self._lease_lost)
        return taken

    async def start(self) -> None:
        """Start (returns early, having started nothing, when told to stop while it
        waits as a standby)."""
        config, limits = self.config, self.config.limits
        loop = asyncio.get_running_loop()
        self._lock_data_dir()
        if config.store is not None and not await self._take_lease():
            return
        self.store = store = open_store(
            self.data_dir, config.durability, config.store, self.keeper, config.disk_reserve
        )
        # the store's copy of the broker's files first: everything below reads them
        self.files = BrokerFiles(self.data_dir, store, own_tls=config.tls_cert_file is None)
        self.files.restore()
        instance = store.load_meta()["broker_instance"]
        clock = LoopClock(loop)
        started = time.monotonic()
        where = self.data_dir if config.store is None else "its PostgreSQL database"
        log.info("recovering the broker's state from %s ...", where)
        # activation's queue monitors come first: the core tells them what happens to
        # queues, and activation, built after the core, acts on what they heard
        monitors = Monitors()
        # so does the relay to the transport: the core tells the transport of its work
        # through it at once, and the transport, built after the core on its parts,
        # connects to it at its own construction
        relay = OutboundRelay()
        procedures = ProcedurePolicy(config.procedures)
        self.engine = engine = Engine(
            store,
            clock,
            instance,
            listener=monitors,
            sink=relay,
            check_procedure=functools.partial(procedures.check, what="activation procedure"),
            limits=CoreLimits(
                lock_timeout=config.lock_timeout,
                statement_timeout=config.statement_timeout,
                max_locks=limits.locks_per_transaction,
                max_detached=limits.detached_per_login,
                message_cache_bytes=config.message_cache_bytes,
                max_message_size=config.max_message_size,
                min_free_disk=config.min_free_disk,
                outcome_window_seconds=config.outcome_window_seconds,
                outcome_window_count=config.outcome_window_count,
            ),
        )
        engine.load(StoredState(store.load_catalog(), store.max_ids(), store.load_meta()))
        store.write_now()
        # logins before the store thread starts: the first start's admin is committed
        # here, synchronously, before its password file is written
        throttle = ThrottleSettings(
            limits.failed_login_window,
            limits.failed_logins_per_address,
            limits.failed_logins_per_login,
        )
        self.logins = logins = Logins(
            store,
            throttle,
            self._login_changed,
            mapped_by=engine.catalog.mapping_to,
            activated_as=engine.catalog.activated_as,
            owned_by=lambda name: self.permissions.owned_by(name),
        )
        logins.load()
        engine.ddl.is_login = logins.__contains__
        created = logins.bootstrap(self.data_dir)
        if created is not None:
            print(f"ssb: created the login 'admin'; its password is in {created}", flush=True)
            log.info("created the login 'admin'; its password is in %s", created)
        commits: CommitHistograms | None = None
        if self.http_port is not None:
            from ._metrics import CommitHistograms  # the HTTP stack only with its port on

            commits = CommitHistograms()  # hears of every commit from the first
        hooks = CommitHooks(
            on_failure=self._store_failed,
            on_trouble=self._store_trouble,
            on_commit=None if commits is None else commits.observe,
            on_abandon=self._store_abandoned,
            abandon_after=config.disk_full_timeout,
        )
        store.attach(loop, hooks)
        self._measure_space()  # before anything is served: a full disk refuses at once
        engine.start()
        log.info(
            "store loaded in %.2f s: %d queue(s), %d ready message(s), %d transmission-queue"
            " direction(s)",
            time.monotonic() - started,
            len(engine.queues),
            sum(q.ready for q in engine.queues.values()),
            len(engine.delivery.outboxes),
        )
        self.permissions = permissions = Permissions(
            store,
            engine.catalog,
            engine.endpoints,
            engine.transactions,
            logins,
            engine.routes.local_target,
            engine.delivery.service_created,
        )
        permissions.load()
        permissions.tables = engine.tables.names
        engine.tables.authorize = permissions.check_table_statement
        engine.tables.created = permissions.table_created
        engine.tables.dropped = functools.partial(permissions.forget, "table")
        operations = Operations(permissions, engine.transactions, Namespaces(engine.catalog))
        operations.merge("the core", engine.operations())
        operations.merge("the daemon", {"ping": _ping}, observing=True)
        operations.merge("logins", logins.operations())
        operations.merge("permissions", permissions.operations())
        operations.merge("procedures", procedures.operations())

        async def login(user: str, password: str, peer: str) -> str | None:
            # an activated task's worker logs in with its one-time token, at no cost
            if monitors.task_login(user, password):
                return None
            return await logins.check(user, password, peer)

        context, fingerprint = server_context(
            self.data_dir, config.host, config.tls_cert_file, config.tls_key_file
        )
        connections = self.connections
        welcome = Welcome(WIRE_VERSION, instance, SERVER_NAME, engine.capacity.max_message_size)
        serving = None if self.keeper is None else self.keeper.held
        next_requests = NextRequests(config.busy_poll)
        self.door = door = Door(
            lambda: ClientConnection(
                engine.transactions,
                welcome,
                store,
                operations,
                login,
                connections,
                limits,
                serving,
                next_requests,
            ),
            context,
            config.allow_plain,
            limits,
            lambda host: sum(1 for c in connections if c.host == host),
        )
        self.client_address = await door.start(config.host, config.client_port)

        transport_settings = TransportSettings.from_section(config.sections.get("transport", {}))
        self.transport = transport = Transport(
            instance=instance,
            delivery=engine.remote,
            endpoints=engine.endpoints,
            routes=engine.routes,
            catalog=engine.catalog,
            statements=engine.ddl,
            store=store,
            clock=loop,
            connector=loop,
            wall_clock=clock.time,
            data_dir=self.data_dir,
            settings=transport_settings,
            relay=relay,
            permission=permissions,
            identity_changed=self.files.save,
        )
        self.broker_address = await transport.start(config.host, config.broker_port)
        operations.merge("the transport", transport.operations())
        self._closers.append(transport.close)

        # after the transport: the messages still arriving from other brokers are its
        views = Views(
            catalog=engine.catalog,
            queues=engine.queues,
            endpoints=engine.endpoints,
            delivery=engine.delivery,
            transactions=engine.transactions,
            cache=engine.cache,
            capacity=engine.capacity,
            timers=engine.dialogs.timers,
            identity=engine.identity,
            store=store,
            clock=clock,
            partials=transport.partials,
        )
        operations.merge("views", views.operations(), observing=True)
        views.merge({"databases": engine.databases.rows})
        views.merge({"tables": functools.partial(_table_rows, store)})
        views.merge(permissions.views())
        views.merge(logins.views())
        views.merge(transport.views())
        views.merge({"broker_nodes": self._nodes_view})

        settings = ActivationSettings.from_section(config.sections.get("activation", {}))
        pool = WorkerPool(
            loopback(self.client_address[0]),
            self.client_address[1],
            settings.idle_workers,
            settings.worker_start_timeout,
            settings.python_path,
        )
        execution_log = ExecutionLog(
            store, monitors.tasks, engine.dialogs.send, self._own, settings.execution_log_rows
        )
        self.activation = manager = ActivationManager(
            monitors,
            settings,
            pool,
            queues=engine.queues,
            notifications=engine.catalog.notifications,
            waiting=engine.receiving.waiting_sessions,
            end_wait=engine.receiving.end_wait,
            fire=engine.events.fire,
            logins=logins,
            procedures=procedures,
            queue_owner=lambda queue: permissions.owner("queue", queue),
            task_ended=execution_log.task_ended,
            stored_procedure=lambda key: engine.catalog.find_procedure(key) is not None,
        )
        operations.merge("activation", manager.operations())
        views.merge(manager.views())
        operations.merge("the scheduler's execution log", execution_log.operations())
        views.merge(execution_log.views())
        manager.start()
        pool.prestart(settings.prestart_workers)
        self._closers.append(manager.close)

        if self.http_port is not None:
            assert commits is not None
            await self._start_http(
                self.http_port, operations, logins, permissions, monitors, context, clock, commits
            )
        # what this start made (a first start: keys, certificates, admin.password) is
        # kept in the store before anyone can learn of it
        self.files.save()
        await self._durable()

        self._own(self._watch_space())
        info = {
            "pid": os.getpid(),
            "broker_instance": instance,
            "host": self.client_address[0],
            "client_port": self.client_address[1],
            "broker_port": self.broker_address[1],
            "durability": config.durability,
            "store": "sqlite" if config.store is None else "postgresql",
            "role": "active",
            "node": None if self.keeper is None else self.keeper.node,
            "tls_fingerprint": fingerprint,
            "http_port": self.http.address[1] if self.http and self.http.address else None,
        }
        (self.data_dir / "broker.json").write_text(json.dumps(info, indent=2))
        self._serving = True
        print(
            f"ssb ready client={self.client_address[0]}:{self.client_address[1]}"
            f" broker=127.0.0.1:{self.broker_address[1]} instance={instance}"
            f" data={self.data_dir} tls={fingerprint}{self._http_text()}"
            + ("" if self.keeper is None else f" node={self.keeper.node}"),
            flush=True,
        )
        _systemd.notify(f"READY=1\nSTATUS=serving clients on port {self.client_address[1]}")

    async def _durable(self) -> None:
        """Wait until everything written so far is durable."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.store.when_durable(self.store.watermark(), lambda: done.set_result(None))
        await done

    async def _start_http(
        self,
        port: int,
        operations: Operations,
        logins: Logins,
        permissions: Permissions,
        monitors: Monitors,
        context: ssl.SSLContext,
        clock: LoopClock,
        commits: CommitHistograms,
    ) -> None:
        """/metrics, /healthz and the dashboard on the HTTP port. The HTTP stack is
        imported only when the port is on: otherwise its many modules would only be more
        objects for every garbage collection to walk."""
        from ._dashboard import Dashboard, dead_letter_queues
        from ._http import HttpServer
        from ._metrics import BrokerCollector, Metrics

        config, engine, store, transport = self.config, self.engine, self.store, self.transport
        connections = self.connections
        collector = BrokerCollector(
            queues=engine.queues,
            delivery=engine.delivery,
            transactions=engine.transactions,
            capacity=engine.capacity,
            cache=engine.cache,
            store=store,
            sessions=connections,
            transport=transport,
            tasks=monitors.tasks,
            keeper=self.keeper,
        )
        self.http = http = HttpServer(
            Metrics(collector, commits),
            self._not_ready,
            logins.check,
            lambda user: permissions.has(user, "VIEW"),
            config.http_token,
            role=self._role,
        )
        dashboard = Dashboard(
            operations,
            engine.transactions,
            store,
            clock,
            logins.check,
            lambda: {display(name): queue.ready for name, queue in engine.queues.items()},
            lambda: dead_letter_queues(engine.catalog.queues),
            config.chart_sample_seconds,
        )
        dashboard.add_routes(http.app)  # before the server starts: aiohttp freezes them
        self.dashboard = dashboard
        self._closers.append(http.close)
        self._closers.append(dashboard.close)
        bound = await http.start(config.http_host, port, context)
        dashboard.start()
        log.info("dashboard at %s://%s:%d/dashboard/", http.scheme, *bound)

    def _http_text(self) -> str:
        if self.http is None or self.http.address is None:
            return ""
        host, port = self.http.address
        return f" http={self.http.scheme}://{host}:{port}"

    def _not_ready(self) -> str | None:
        """Why the broker is not ready to take new work (None: it is)."""
        if self.stopped.is_set():
            return "the broker is stopping"
        if self.keeper is not None and not self.keeper.held():
            return f"this daemon lost the broker's lease: {self.keeper.reason}"
        if self.store.failed is not None:
            return f"the store failed: {describe_failure(self.store.failed)}"
        return self.engine.capacity.refusal

    def _role(self) -> str:
        if self.keeper is None:
            return "active"
        return "active" if self.keeper.held() else "stopping"

    def _nodes_view(self) -> list[dict[str, Any]]:
        """The daemons of this broker (one, with a SQLite store): which serves, which wait."""
        keeper = self.keeper
        if keeper is None:
            host, port = self.client_address
            return [
                {
                    "node": None,
                    "name": f"{os.uname().nodename} pid {os.getpid()}",
                    "role": "active",
                    "address": f"{host}:{port}",
                    "seen_seconds_ago": 0.0,
                    "this_daemon": True,
                    "lease_epoch": None,
                    "lease_age_seconds": None,
                }
            ]
        rows = []
        for node in keeper.lease.nodes():
            mine = node.node == keeper.node
            rows.append(
                {
                    "node": node.node,
                    "name": node.name,
                    "role": self._role() if mine else node.role,
                    "address": node.address,
                    "seen_seconds_ago": 0.0 if mine else round(node.seen_age, 3),
                    "this_daemon": mine,
                    "lease_epoch": keeper.epoch if mine else None,
                    "lease_age_seconds": keeper.lease_age() if mine else None,
                }
            )
        return rows

    def _login_changed(self, name: str) -> None:
        """A login's password changed or it was dropped: its dashboard sessions end. A
        dropped login also loses its grants and its open sessions (their transactions
        roll back); a changed password leaves open sessions alone. Once admin's password
        has changed, the store no longer keeps the first start's admin.password."""
        if name == ADMIN and self._serving:
            self.files.forget(PASSWORD_FILE)
        if self.dashboard is not None:
            self.dashboard.login_changed(name)
        if name in self.logins:
            return
        self.permissions.login_dropped(name)
        dropped = [c for c in self.connections if c.session is not None and c.session.user == name]
        for connection in dropped:
            connection.close()
        if dropped:
            log.info("closed %d session(s) of the dropped login %r", len(dropped), name)

    def _own(self, coro: Any) -> None:
        job = asyncio.get_running_loop().create_task(coro)
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    def _measure_space(self) -> None:
        """Tell the core the free space for the store, and whether its disk reserve is in
        place (made again when there is room)."""
        store, capacity = self.store, self.engine.capacity
        try:
            free = store.free_bytes()
            if free is not None:  # (None: a database server's disk)
                capacity.measured(free, str(self.data_dir))
            capacity.reserve_kept(store.keep_reserve(), str(self.data_dir))
        except (OSError, StoreError) as exc:
            if not self._unmeasured:  # once a spell: the next tries come every second
                log.warning(
                    "cannot measure free space for %s: %s; new messages are taken or refused"
                    " as the last measurement said until it can be measured again",
                    self.data_dir,
                    exc,
                )
            self._unmeasured += 1
            return
        if self._unmeasured:
            log.warning("free space is measured again (%d tries failed)", self._unmeasured)
            self._unmeasured = 0

    async def _watch_space(self) -> None:
        store = self.store
        last_commits, idle_since = store.commits, time.monotonic()
        released = False  # memory given back in this idle spell
        while True:
            self._measure_space()
            now = time.monotonic()
            if store.commits != last_commits:
                last_commits, idle_since, released = store.commits, now, False
            elif now - idle_since >= CHECKPOINT_IDLE:
                # a slice of the store's free space returned per call while idle, its logs
                # and caches shrunk
                left = await store.checkpoint()
                if left is not None and (not released or not left):
                    # what a drained backlog left behind, at once and at the end
                    _heap.collect()
                    await asyncio.get_running_loop().run_in_executor(None, _heap.trim)
                    released = True
                if left == 0:
                    idle_since = now + 3600.0  # done for this idle spell
            await asyncio.sleep(SPACE_CHECK)

    def _lease_lost(self, reason: str) -> None:
        """This daemon may no longer hold the lease: answer nothing more, and stop."""
        self.exit_code = EXIT_LEASE_LOST
        if self.door is not None:
            self.door.close()
        for connection in list(self.connections):
            connection.close()
        log.critical("stopping at once, writing nothing more: %s", reason)
        self.stopped.set()

    def _store_failed(self, exc: BaseException) -> None:
        if lease_lost(exc):
            reason = f"the store refused to commit: {describe_failure(exc)}"
            if self.keeper is not None:
                self.keeper.lost(reason)  # (tells _lease_lost)
            else:
                self._lease_lost(reason)
            return
        log.critical(
            "a store commit failed and cannot be retried (%s); stopping: restart the daemon,"
            " it rebuilds from what is durable",
            describe_failure(exc),
        )
        self.exit_code = EXIT_STORE_FAILURE
        self.stopped.set()

    def _store_trouble(self, reason: str | None) -> None:
        if reason is None:
            self.engine.capacity.commit_succeeded()
        else:
            self.engine.capacity.commit_failed(reason)

    def _store_abandoned(self, reason: str) -> None:
        """The store gave up the batches it could not write: answer whoever waited for
        them, and start again from what is durable (memory is ahead of it)."""
        text = (
            f"the commit could not be written for {self.config.disk_full_timeout:g} s"
            f" (disk_full_timeout: {reason}); it was rolled back, nothing of it was applied;"
            " the broker starts again from what is durable and refuses new messages until"
            " the disk has room (RECEIVE and END CONVERSATION work)"
        )
        durable = self.store.durable
        for connection in list(self.connections):
            connection.abandon(durable, text)
        log.error("starting again from what is durable: %s", reason)
        self.restart = reason
        self.stopped.set()

    def same_ports(self) -> Config:
        """The config of the broker that starts again in this one's place: the ports it
        listened on (port 0 chose them)."""
        http = self.http.address[1] if self.http and self.http.address else None
        return dataclasses.replace(
            self.config,
            client_port=self.client_address[1],
            broker_port=self.broker_address[1] if self.broker_address else 0,
            http_port=http if http is not None else self.config.http_port,
        )

    # ---- stop -----------------------------------------------------------------------------

    async def stop(self) -> None:
        if self.door is not None:
            self.door.close()  # no new clients from here on
        for job in list(self._jobs):
            job.cancel()
        for closer in reversed(self._closers):
            try:
                await closer()
            except Exception:
                log.exception("error while stopping a subsystem")
        for connection in list(self.connections):
            connection.close()
            connection.connection_lost(None)
        if hasattr(self, "engine"):
            self.engine.close()
        if hasattr(self, "store") and self.store.failed is None:
            try:
                await self.store.close()
            except (StoreError, OSError) as exc:
                if self.exit_code == EXIT_LEASE_LOST:
                    log.info("the last batch was not written (this daemon lost its lease)")
                else:
                    log.error(
                        "the last batch could not be written (%s); it was not acknowledged", exc
                    )
        if self.keeper is not None:
            await self.keeper.close()  # gives the lease up, if it is still held
        if self._lock_file is not None:  # only the daemon holding the lock wrote broker.json
            (self.data_dir / "broker.json").unlink(missing_ok=True)
            self._lock_file.close()


def _ping(session: Any) -> str:
    return "pong"


async def serve(config: Config) -> int:
    loop = asyncio.get_running_loop()
    signalled = asyncio.Event()
    while True:
        broker = Broker(config)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _stop, broker, signalled)
        try:
            await broker.start()
        except BaseException:
            await broker.stop()
            raise
        await broker.stopped.wait()
        again = broker.restart is not None and not signalled.is_set()
        log.info("stopping" + (", to start again" if again else ""))
        _systemd.notify("STATUS=starting again from what is durable" if again else "STOPPING=1")
        await broker.stop()
        if not again or signalled.is_set():  # (a signal while it stopped ends it all)
            return broker.exit_code
        config = broker.same_ports()  # a commit was abandoned: again, from what is durable


def _stop(broker: Broker, signalled: asyncio.Event) -> None:
    signalled.set()
    broker.stopped.set()


def run(config: Config) -> int:
    # the store, keys and password files are private from their creation on
    os.umask(0o077)
    _logging.configure(config.log_level, config.log_format)
    _heap.tune()
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # uvloop is optional; asyncio's own loop works too
        factory = None
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(serve(config))
    except (DataDirLocked, ConfigError, StoreUnavailable) as exc:
        print(f"ssb: {exc}", file=sys.stderr)
        return EXIT_CANNOT_START
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            print(
                f"ssb: cannot listen: {exc.strerror} ({exc}); stop the other process or pick"
                " other ports with --client-port / --broker-port (0 = any free port)",
                file=sys.stderr,
            )
            return EXIT_CANNOT_START
        raise


def data_dir_info(data_dir: Path) -> dict[str, Any]:
    """What a running daemon wrote about itself into its data directory."""
    return dict(json.loads((data_dir / "broker.json").read_text()))


def _table_rows(store: Store) -> list[dict[str, object]]:
    """The view `tables`: each users' table, its database and its rows."""
    return [
        {"database": database, "name": name, "rows": rows}
        for database, name, rows in store.table_sizes()
    ]
