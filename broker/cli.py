"""The `ssb` command: `ssb serve`, `ssb view NAME`, `ssb status`, `ssb login ...`."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._config import ConfigError, load

DEFAULT_URL = "ssb://127.0.0.1:4021"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ssb", description="ssb message broker")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve",
        help="run the broker daemon",
        description="Run the broker in the foreground. With no options: data in ./ssb-data, "
        "client port 4021 and broker port 4022 on 127.0.0.1. SIGTERM or Ctrl-C stops it "
        "cleanly (open transactions roll back).",
    )
    serve.add_argument("--config", type=Path, help="TOML config file (see deploy/ssb.toml)")
    serve.add_argument("--data-dir", type=Path, help="where the store lives (default ./ssb-data)")
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
    return parser


def _url_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help="broker URL (default: $SSB_URL, else the broker of ./ssb-data as admin, else "
        f"{DEFAULT_URL})",
    )


def _bridge_arguments(parser: argparse.ArgumentParser) -> None:
    # declared here, run by spark_bridge._cli: `ssb serve` never imports pyspark
    parser.add_argument("--config", type=Path, help="TOML file (see the README, Spark bridge)")
    parser.add_argument("--broker", help=f"broker URL (default env SSB_URL or {DEFAULT_URL})")
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
        from ._daemon import run

        try:
            config = load(
                args.config,
                {
                    "data_dir": args.data_dir,
                    "host": args.host,
                    "client_port": args.client_port,
                    "broker_port": args.broker_port,
                    "durability": args.durability,
                    "log_level": args.log_level,
                },
            )
        except ConfigError as exc:
            print(f"ssb: {exc}", file=sys.stderr)
            return 2
        return run(config)

    if args.command == "spark-bridge":
        try:
            from ssb.spark_bridge._cli import main as bridge_main
        except ImportError as exc:
            print(
                f"ssb spark-bridge needs pyspark: install the Spark extra from the clone,"
                f" pip install -e '.[spark]' ({exc})",
                file=sys.stderr,
            )
            return 2
        return bridge_main(args)

    from ssb import client

    try:
        with client.connect_sync(_url(args.url)) as conn:
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
    except (client.BrokerError, ValueError) as exc:
        print(f"ssb: {exc}", file=sys.stderr)
        return 1
    return 0


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


def _url(given: str | None) -> str:
    """--url, else $SSB_URL, else the broker running from ./ssb-data (as admin, with the
    password the first start wrote there), else the default."""
    if given:
        return given
    if os.environ.get("SSB_URL"):
        return os.environ["SSB_URL"]
    from ssb.client import local_url

    return local_url("ssb-data") or DEFAULT_URL
