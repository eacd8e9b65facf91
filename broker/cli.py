"""The `ssb` command: `ssb serve`, `ssb view NAME`, `ssb status`, `ssb login ...`,
`ssb backup DIR`, `ssb diagnose URL...`, `ssb spark-bridge`, `ssb sql [FILE...]`.

Every mistake (a bad option, a setting out of range, a data directory or address that
cannot be used, a broker that does not answer) is one line on stderr that says what to
do, and a non-zero exit; never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import getpass
import os
import socket
import sys
import tomllib
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, Final, NoReturn
from urllib.parse import urlsplit

from ._config import Config, ConfigError, load

DEFAULT_URL: Final = "ssb://127.0.0.1:4021"
DISTRIBUTION: Final = "ssb-broker"
URL_FORM: Final = "ssb://USER:PASSWORD@HOST:PORT"
# what to do about an address the daemon cannot listen on
LISTEN_HINTS: Final = {
    errno.EADDRNOTAVAIL: "it is not an address of this machine; give --host one it has"
    " (127.0.0.1, or 0.0.0.0 for all)",
    errno.EACCES: "ports below 1024 need root; pick ports from 1024 up (0 = any free port)",
    errno.EADDRINUSE: "another process has it; stop that process or pick another port"
    " (0 = any free port)",
}


def version() -> str:
    """This installation's version (the checkout's pyproject.toml when not installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    try:
        project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
        return str(project["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


class _Parser(argparse.ArgumentParser):
    """argparse, with a mistake reported in one line (the usage is a --help away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ssb", description="ssb message broker")
    parser.add_argument("--version", action="version", version=f"ssb {version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve",
        help="run the broker daemon",
        description="Run the broker in the foreground. With no options: data in ./ssb-data, "
        "client port 4021 and broker port 4022 on 127.0.0.1. SIGTERM or Ctrl-C stops it "
        "cleanly (open transactions roll back).",
    )
    serve.add_argument("--config", type=_given_path, help="TOML config file (see deploy/ssb.toml)")
    # (as text: an empty --data-dir is refused, where Path("") would be the working directory)
    serve.add_argument("--data-dir", help="where the store lives (default ./ssb-data)")
    serve.add_argument(
        "--store",
        metavar="URL",
        help="keep the broker's state in this PostgreSQL database,"
        " postgresql://USER@HOST:PORT/DATABASE (default: the SQLite file in --data-dir)",
    )
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--client-port", type=int, help="client port (default 4021; 0 = any free)")
    serve.add_argument(
        "--broker-port", type=int, help="broker-to-broker port (default 4022; 0 = any free)"
    )
    serve.add_argument(
        "--durability",
        choices=("fsync", "os"),
        help="fsync: acknowledged = on disk (default); os: acknowledged = survives a daemon crash",
    )
    serve.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR (default INFO)")
    serve.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="text: lines for people (default); json: one JSON object a line",
    )
    serve.add_argument(
        "--http-port",
        type=int,
        help="serve /metrics, /healthz and the dashboard on this port (default: off; 0 = any free)",
    )
    serve.add_argument(
        "--http-host", help="address of the HTTP port (default 127.0.0.1, whatever --host says)"
    )

    bridge = commands.add_parser(
        "spark-bridge",
        help="run activated readers of queues as Spark tasks (needs pyspark)",
        description="Subscribe to QUEUE_ACTIVATION events of the given queues and run "
        "their readers as Spark tasks, until SIGTERM or Ctrl-C (readers finish their "
        "transaction first). Example: ssb spark-bridge --master local[4] "
        "--queue Orders=myjobs.orders:process",
    )
    _bridge_arguments(bridge)

    for name, text in (
        (
            "view",
            "print a view as a table (conversation_endpoints, service_queues, queue:NAME, ...)",
        ),
        ("status", "print this broker's instance id and counts"),
    ):
        sub = commands.add_parser(name, help=text, description=text)
        if name == "view":
            sub.add_argument("name", help="view name, or queue:NAME to read a queue")
        _url_argument(sub)

    login = commands.add_parser(
        "login",
        help="add, change or drop a login of the running broker (needs CONTROL: admin)",
        description="Logins live in the broker's store as salted hashes. `add NAME` with no "
        "--password-stdin makes a random password and prints it once; `passwd NAME` asks "
        "for the new password (or reads it from stdin); `drop NAME` removes the login.",
    )
    login.add_argument("action", choices=("add", "passwd", "drop"))
    login.add_argument("name", help="the login name")
    login.add_argument(
        "--password-stdin", action="store_true", help="read the password from standard input"
    )
    _url_argument(login)

    backup = commands.add_parser(
        "backup",
        help="copy a broker's store and keys, also while it runs",
        description="Copy the broker of --data-dir into DIR: its store (SQLite's online backup:"
        " one consistent snapshot, the broker keeps running), its identity and TLS keys and "
        "admin.password. `ssb serve --data-dir DIR` then starts the same broker.",
    )
    backup.add_argument(
        "dir", type=_given_path, help="where the copy goes: a new or empty directory"
    )
    backup.add_argument(
        "--data-dir",
        type=_given_path,
        default=Path("ssb-data"),
        help="the data directory of the broker to copy (default ./ssb-data)",
    )
    backup.add_argument(
        "--store",
        metavar="URL",
        help="the broker's PostgreSQL store, if it has one (ssb backup then says how to"
        " back it up with PostgreSQL's own tools)",
    )

    diagnose = commands.add_parser(
        "diagnose",
        help="find why messages do not flow between brokers (routes, certificates, ...)",
        description="Read each broker's views (as ssbdiagnose does) and print each problem"
        " with what to do: routes both ways, trusted certificates, the same contracts on both"
        " sides, queues on, activation procedures allowed; messages held in transmission"
        " queues and why, conversations in error, broker links down. Without --from/--to,"
        " every routed service and conversation is checked. Exit 0: no problem; 1: problems;"
        " 2: a usage mistake or a broker that cannot be reached.",
    )
    diagnose.add_argument("urls", nargs="+", metavar="URL", help=f"a broker, {URL_FORM}")
    diagnose.add_argument(
        "--from", dest="from_service", metavar="SERVICE", help="the initiator service"
    )
    diagnose.add_argument("--to", dest="to_service", metavar="SERVICE", help="the target service")

    sql = commands.add_parser(
        "sql",
        help="run T-SQL files (Service Broker's statements), or a T-SQL shell",
        description="Run T-SQL files in order in one session, as sqlcmd -i does: batches end"
        " at GO, an error ends its batch and the run goes on (unless -b); exit 1 when a batch"
        " failed. With no FILE, an interactive shell.",
    )
    from ssb.tsql import add_arguments

    add_arguments(sql)
    _url_argument(sql)
    return parser


def _broker_url(given: str) -> str:
    """A broker URL option's value: an empty one is a mistake, never the default."""
    if not given:
        raise argparse.ArgumentTypeError(
            f"the broker URL is empty; give {URL_FORM}, or leave the option out for the default"
        )
    return given


def _given_path(given: str) -> Path:
    """A file or directory option's value: an empty one is a mistake (Path("") would be
    the working directory), never the default."""
    if not given:
        raise argparse.ArgumentTypeError("the path is empty; name a file or directory")
    return Path(given)


def _url_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        type=_broker_url,
        help="broker URL (default: $SSB_URL, else the broker of ./ssb-data as admin, else "
        f"{DEFAULT_URL})",
    )


def _bridge_arguments(parser: argparse.ArgumentParser) -> None:
    # declared here, run by ssb.spark_bridge.main: `ssb serve` never imports pyspark
    parser.add_argument(
        "--config", type=_given_path, help="TOML file (see the documentation, Spark)"
    )
    parser.add_argument(
        "--broker", type=_broker_url, help=f"broker URL (default env SSB_URL or {DEFAULT_URL})"
    )
    parser.add_argument("--master", help="Spark master, e.g. local[4] (omit under spark-submit)")
    parser.add_argument(
        "--queue",
        action="append",
        default=[],
        metavar="QUEUE=module:function",
        help="serve QUEUE: its readers call function(message, conn); repeatable",
    )
    parser.add_argument(
        "--scheduler", action="append", default=[], metavar="NAME", help="run scheduler NAME"
    )
    parser.add_argument("--batch-size", type=int, help="RECEIVE TOP(n) per transaction (100)")
    parser.add_argument("--idle-timeout", type=float, help="a reader exits after this idle (2 s)")
    parser.add_argument("--name", help="bridge name, prefix of its own objects (spark-bridge)")
    parser.add_argument(
        "--python-path", action="append", default=[], help="directory executors import from"
    )
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting"
    )


def format_table(rows: list[dict[str, Any]]) -> str:
    """Rows as an aligned text table (empty views say so)."""
    if not rows:
        return "(no rows)"
    columns = list(rows[0])
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        text = value[:40].decode("utf-8", "replace")
        text = "".join(c if c.isprintable() else "." for c in text)
        return text + ("..." if len(value) > 40 else "")
    return str(value)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "backup":
        return _backup(args.data_dir, args.dir, args.store)
    if args.command == "diagnose":
        from ssb.tools.diagnose import run

        return run(args.urls, args.from_service, args.to_service)

    if args.command == "sql":
        from ssb import client
        from ssb.tsql import main as sql_main

        url, source = _url(args.url)
        try:
            return sql_main(args, url)
        except (client.BrokerError, OSError) as exc:
            print(f"ssb sql: {_failure(exc, url, source)}", file=sys.stderr)
            return 2

    if args.command == "spark-bridge":
        try:
            from ssb.spark_bridge import main as bridge_main
        except ImportError as exc:
            print(
                f"ssb spark-bridge needs pyspark: install the Spark extra from the clone,"
                f" pip install -e '.[spark]' ({exc})",
                file=sys.stderr,
            )
            return 2
        return bridge_main(args)

    from ssb import client

    url, source = _url(args.url)
    try:
        with client.connect_sync(url) as conn:
            if args.command == "login":
                return _login(conn, args)
            if args.command == "view":
                print(format_table(conn.view(args.name)))
            else:
                queues = conn.view("service_queues")
                (resources,) = conn.view("broker_resources")
                print(f"broker instance    {conn.broker_instance()}")
                print(f"server             {conn.server}")
                print(f"queues             {len(queues)}")
                print(f"messages ready     {sum(q['messages_ready'] for q in queues)}")
                print(f"messages stored    {resources['stored_messages']}")
                print(f"conversations      {resources['conversation_endpoints']}")
                print(f"transmission queue {resources['transmission_queue_messages']}")
                if resources["refusal"]:
                    print(f"refusing messages  {resources['refusal']}")
    except client.BrokerError as exc:
        print(f"ssb: {_failure(exc, url, source)}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"ssb: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _serve(args: argparse.Namespace) -> int:
    from ._activation.manager import ActivationSettings
    from ._daemon import EXIT_CANNOT_START, run
    from ._transport import TransportSettings

    try:
        config = load(
            args.config,
            {
                "data_dir": args.data_dir,
                "store": args.store,
                "host": args.host,
                "client_port": args.client_port,
                "broker_port": args.broker_port,
                "durability": args.durability,
                "log_level": args.log_level,
                "log_format": args.log_format,
                "http_port": args.http_port,
                "http_host": args.http_host,
            },
        )
        # the sections other parts read, checked before anything is created
        TransportSettings.from_section(config.sections.get("transport", {}))
        ActivationSettings.from_section(config.sections.get("activation", {}))
    except ConfigError as exc:
        print(f"ssb: {exc}", file=sys.stderr)
        return EXIT_CANNOT_START
    problem = _data_dir_problem(config.data_dir) or _listen_problem(config)
    if problem is not None:
        print(f"ssb: {problem}", file=sys.stderr)
        return EXIT_CANNOT_START
    try:
        return run(config)
    except OSError as exc:  # e.g. an address taken between the check and the start
        hint = LISTEN_HINTS.get(exc.errno or 0) if exc.filename is None else None
        print(f"ssb: cannot start: {exc}" + (f"; {hint}" if hint else ""), file=sys.stderr)
        return EXIT_CANNOT_START


def _data_dir_problem(data_dir: Path) -> str | None:
    """Why `data_dir` cannot hold a store, when a file stands where a directory must."""
    if data_dir.exists():
        if data_dir.is_dir():
            return None
        return f"the data directory {data_dir} is a file; --data-dir names a directory"
    for parent in data_dir.absolute().parents:
        if parent.exists():
            if parent.is_dir():
                return None
            return f"cannot create the data directory {data_dir}: {parent} is a file"
    return None


def _listen_problem(config: Config) -> str | None:
    """Bind each port the daemon will listen on once and let go, so that an address this
    machine does not have, a port that needs root or one in use is reported before the
    daemon creates anything."""
    ports = [
        ("--client-port", config.host, config.client_port),
        ("--broker-port", config.host, config.broker_port),
    ]
    if config.http_port is not None:
        ports.append(("--http-port", config.http_host, config.http_port))
    for option, host, port in ports:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            socket.create_server((host, port), family=family).close()
        except OSError as exc:
            return f"cannot listen on {_listen_failure(exc, host, port, option)}"
    return None


def _listen_failure(exc: OSError, host: str, port: int, option: str) -> str:
    """Where listening failed, why, and what to do."""
    if exc.errno is not None and exc.errno < 0:  # getaddrinfo's codes: the name
        return f"{host} (no such host): give --host a name or address of this machine"
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    where = host if exc.errno == errno.EADDRNOTAVAIL or not port else f"{host}:{port} ({option})"
    hint = LISTEN_HINTS.get(exc.errno or 0)
    return f"{where} ({reason})" + (f": {hint}" if hint else "")


def _backup(data_dir: Path, target: Path, store: str | None) -> int:
    from ._backup import BackupError, backup

    try:
        copied = backup(data_dir, target, store)
    except BackupError as exc:
        print(f"ssb: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file it may not read or write: one line, what to do
        print(
            f"ssb: backup failed: {exc.strerror or exc} ({exc.filename or data_dir}); run it as"
            " the broker's user, or give --data-dir / a target it can read and write",
            file=sys.stderr,
        )
        return 1
    print(f"backed up the broker of {data_dir} into {target}:")
    for item in copied:
        print(f"  {item.name:<28} {item.size:>12,} bytes")
    print(f"start a broker from it with: ssb serve --data-dir {target}")
    return 0


def _failure(exc: Exception, url: str, source: str) -> str:
    """The client's error, with what to do when no broker answers or the URL names no
    login."""
    from ssb import client

    parts = urlsplit(url)
    try:
        addresses = client.url_addresses(url)
    except ValueError:
        addresses = [parts.netloc.rpartition("@")[2]]
    if isinstance(exc, client.ConnectionLostError) and isinstance(
        exc.__cause__, ConnectionRefusedError
    ):
        ports = ", ".join(sorted({a.rpartition(":")[2] for a in addresses}))
        return (
            f"no broker answers at {','.join(addresses)} ({source}; connection refused): is"
            f" it running (`ssb serve`), and is {ports} its client port? --url or $SSB_URL"
            f" names the broker and the login: {URL_FORM}"
        )
    if isinstance(exc, client.LoginFailedError) and not parts.username:
        return (
            f"{exc}; give the login with --url or $SSB_URL, or run this next to the broker's"
            " ./ssb-data (its first start wrote admin's password to ssb-data/admin.password)"
        )
    return str(exc)


def _login(conn: Any, args: argparse.Namespace) -> int:
    if args.action == "drop":
        conn.drop_login(args.name)
        print(f"login '{args.name}' dropped")
        return 0
    password: str | None = None
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    elif args.action == "passwd":
        password = getpass.getpass(f"new password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            print("ssb: the passwords differ; nothing changed", file=sys.stderr)
            return 1
    if args.action == "passwd":
        conn.alter_login(args.name, password)
        print(f"password of login '{args.name}' changed")
        return 0
    created = conn.create_login(args.name, password)
    print(f"login '{args.name}' created")
    if "password" in created:
        print(f"password: {created['password']}")
    return 0


def _url(given: str | None) -> tuple[str, str]:
    """--url, else $SSB_URL, else the broker running from ./ssb-data (as admin, with the
    password the first start wrote there), else the default; and which it was."""
    if given:
        return given, "--url"
    if os.environ.get("SSB_URL"):
        return os.environ["SSB_URL"], "$SSB_URL"
    from ssb.client import local_url

    local = local_url("ssb-data")
    if local is not None:
        return local, "from ./ssb-data/broker.json"
    return DEFAULT_URL, "the default URL"
