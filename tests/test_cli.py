"""The `ssb` command line: its commands, and every mistake as one line on stderr."""

from __future__ import annotations

import os
import shutil
import socket
import tomllib
from pathlib import Path

import pytest
from daemon import BrokerProcess, one_error_line, run_ssb, serve_once

from ssb import client, tools
from ssb.tools import _daemon

ROOT = Path(__file__).parent.parent
NOT_HERE = "192.0.2.1"  # TEST-NET-1 (RFC 5737): never an address of this machine


def test_version_is_the_distributions() -> None:
    result = run_ssb("--version")
    assert result.returncode == 0
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert result.stdout.strip() == f"ssb {version}"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("serve", "--log-level", "verbose"), "log_level must be one of"),
        (("serve", "--durability", "sometimes"), "invalid choice: 'sometimes'"),
        (("serve", "--client-port", "many"), "invalid int value: 'many'"),
        (("serve", "--client-port", "70000"), "client_port must be a port number"),
        (("serve", "--host", NOT_HERE), "not an address of this machine"),
        (("serve", "--host", "no-such-host.invalid"), "no such host"),
        (("nonsense",), "invalid choice: 'nonsense'"),
        ((), "required: command"),
        (("backup",), "required: dir"),
    ],
)
def test_a_mistake_is_one_line(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    data = tmp_path / "data"
    result = serve_once(data, *args[1:]) if args[:1] == ("serve",) else run_ssb(*args)
    assert says in one_error_line(result)
    assert not data.exists()  # nothing was created


def test_a_data_directory_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    for data_dir, says in (
        (afile, "is a file; --data-dir names a directory"),
        (afile / "data", f"{afile} is a file"),
    ):
        assert says in one_error_line(serve_once(data_dir))


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ("[transport]\nfragment_size = -5\n", "[transport] fragment_size must be a whole number"),
        ("[transport]\nack_delay = inf\n", "[transport] ack_delay must be a number from"),
        ("[transport]\ntls = 1\n", "[transport] tls must be true or false"),
        ("[activation]\ncheck_interval = 0\n", "[activation] check_interval must be"),
        ("[activation]\nidle_workers = 100000000\n", "[activation] idle_workers must be"),
        ("[activation]\nexecution_log_rows = 1.5\n", "[activation] execution_log_rows must"),
        ('[activation]\npython_path = "/srv"\n', "python_path must be a list"),
        ("[activation]\ncheck_intervall = 1\n", "unknown [activation] setting(s) check_intervall"),
    ],
)
def test_a_section_setting_out_of_range_is_one_line(
    tmp_path: Path, section: str, says: str
) -> None:
    config = tmp_path / "ssb.toml"
    config.write_text(section)
    data = tmp_path / "data"
    result = serve_once(data, "--config", str(config))
    assert says in one_error_line(result)
    assert result.returncode == 2
    assert not data.exists()


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("host = 5\n", "host must be an address"),
        ('host = ""\n', "host must be an address"),  # (not every address)
        ("client_port = true\nbroker_port = 0\n", "client_port must be a port number"),
        ("client_port = 0\nbroker_port = false\n", "broker_port must be a port number"),
        ("limits = 5\n", "limits must be a section"),
        ("transport = 5\n", "transport must be a section"),
    ],
)
def test_a_setting_of_the_wrong_type_is_one_line(tmp_path: Path, setting: str, says: str) -> None:
    config = tmp_path / "ssb.toml"
    config.write_text(
        setting if "port" in setting else setting + "client_port = 0\nbroker_port = 0\n"
    )
    data = tmp_path / "data"
    # (the file's ports, not the command line's: a broker that starts fails the test)
    result = run_ssb("serve", "--data-dir", str(data), "--config", str(config), timeout=30)
    assert says in one_error_line(result)
    assert result.returncode == 2
    assert not data.exists()


def test_an_empty_data_directory_is_refused_not_taken_as_the_working_directory(
    tmp_path: Path,
) -> None:
    config = tmp_path / "ssb.toml"
    config.write_text('data_dir = ""\nclient_port = 0\nbroker_port = 0\n')
    for args in (
        ("--config", str(config)),
        ("--data-dir", "", "--client-port", "0", "--broker-port", "0"),
    ):
        # (a broker that starts fails the test: it serves until the timeout)
        result = run_ssb("serve", *args, cwd=tmp_path, timeout=30)
        assert 'data_dir = "" names no path' in one_error_line(result)
        assert result.returncode == 2
    assert [p.name for p in tmp_path.iterdir()] == ["ssb.toml"]  # no store was made here


def test_a_config_file_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "latin1.toml").write_bytes(b'host = "caf\xe9"\n')
    for given, said in (
        ("", "the path is empty"),
        (str(tmp_path), "cannot be read: Is a directory"),
        (str(tmp_path / "latin1.toml"), "is not UTF-8 text"),
    ):
        result = run_ssb("serve", "--config", given, cwd=tmp_path, timeout=30)
        assert said in one_error_line(result)
        assert result.returncode == 2


def test_an_empty_path_to_backup_is_refused(tmp_path: Path) -> None:
    for args in (("", "--data-dir", str(tmp_path)), (str(tmp_path / "copy"), "--data-dir", "")):
        result = run_ssb("backup", *args, cwd=tmp_path, timeout=30)
        assert "the path is empty" in one_error_line(result)
        assert result.returncode == 2
    assert list(tmp_path.iterdir()) == []


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = serve_once(tmp_path / "data", "--client-port", str(port))
    line = one_error_line(result)
    assert f"127.0.0.1:{port} (--client-port)" in line and "pick another port" in line
    assert not (tmp_path / "data").exists()


def test_a_privileged_port_is_one_line(tmp_path: Path) -> None:
    # root may bind any port: take that capability away from the command
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv to drop CAP_NET_BIND_SERVICE")
        prefix = (setpriv, "--inh-caps=-net_bind_service", "--bounding-set=-net_bind_service")
    result = serve_once(tmp_path / "data", "--client-port", "1", prefix=prefix)
    assert "ports below 1024 need root" in one_error_line(result)


@pytest.mark.parametrize(
    "command", [("status",), ("view", "service_queues"), ("login", "drop", "x")]
)
def test_no_broker_answering_is_one_line_with_what_to_do(command: tuple[str, ...]) -> None:
    port = tools.free_port()
    line = one_error_line(run_ssb(*command, "--url", f"ssb://admin:pw@127.0.0.1:{port}"))
    assert f"no broker answers at 127.0.0.1:{port}" in line
    assert "ssb serve" in line and "$SSB_URL" in line and "ssb://USER:PASSWORD@HOST:PORT" in line


@pytest.mark.parametrize(
    "command",
    [
        ("status", "--url", ""),
        ("view", "service_queues", "--url", ""),
        ("sql", "--url", ""),
        ("spark-bridge", "--queue", "Orders=jobs:process", "--broker", ""),
    ],
)
def test_an_empty_broker_url_is_refused_not_taken_as_the_default(
    broker: BrokerProcess, tmp_path: Path, command: tuple[str, ...]
) -> None:
    # an empty --url fell back to $SSB_URL (else the default): this broker answered it
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYSPARK_GATEWAY_PORT")}
    env.update(SSB_URL=broker.url, PATH=str(tmp_path))  # (no java: Spark would not start)
    result = run_ssb(*command, env=env, stdin="")
    line = one_error_line(result)
    assert result.returncode == 2
    assert "is empty" in line and "ssb://USER:PASSWORD@HOST:PORT" in line, line


def test_a_url_without_login_says_how_to_give_one(broker: BrokerProcess) -> None:
    line = one_error_line(run_ssb("status", "--url", f"ssb://127.0.0.1:{broker.client_port}"))
    assert "login failed" in line and "--url or $SSB_URL" in line and "admin.password" in line


def test_status_next_to_ssb_data_logs_in_as_admin(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "ssb-data").start()
    try:
        env = {k: v for k, v in os.environ.items() if k != "SSB_URL"}
        result = run_ssb("status", cwd=tmp_path, env=env)
        assert result.returncode == 0, result.stderr
        assert broker.instance in result.stdout
    finally:
        broker.kill()


def test_spark_bridge_without_java_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYSPARK_GATEWAY_PORT")}
    env["PATH"] = str(tmp_path)  # no java on it
    line = one_error_line(run_ssb("spark-bridge", "--queue", "Orders=jobs:process", env=env))
    assert "Java 17 or 21" in line and "java -version" in line
    env["JAVA_HOME"] = str(tmp_path)  # no bin/java in it
    assert f"JAVA_HOME={tmp_path} has no bin/java" in one_error_line(
        run_ssb("spark-bridge", "--queue", "Orders=jobs:process", env=env)
    )


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (("--batch-size", "0"), "batch_size must be a whole number >= 1"),
        (("--idle-timeout", "nan"), "idle_timeout must be a finite number of seconds > 0"),
        (("--idle-timeout", "inf"), "idle_timeout must be a finite number of seconds > 0"),
        (("--idle-timeout", "-1"), "idle_timeout must be a finite number of seconds > 0"),
        (("--broker", "ssb://admin:pw@127.0.0.1:99999"), "has a bad port"),
    ],
)
def test_spark_bridge_mistakes_are_one_line_before_spark_starts(
    option: tuple[str, ...], says: str
) -> None:
    pytest.importorskip("pyspark")
    result = run_ssb("spark-bridge", "--queue", "Orders=jobs:process", *option, timeout=120)
    assert says in one_error_line(result)
    assert result.returncode == 2
    assert "Spark session" not in result.stdout


def test_serve_help_documents_the_options() -> None:
    out = run_ssb("serve", "--help").stdout
    for option in ("--data-dir", "--config", "--host", "--client-port", "--broker-port"):
        assert option in out


async def test_view_and_status_print_tables(broker: BrokerProcess, conn: client.Connection) -> None:
    await conn.create_queue("Orders")
    await conn.create_service("OrderService", queue="Orders", contracts=["DEFAULT"])
    h = await conn.begin_dialog("OrderService", "OrderService")
    await conn.send(h, body="hello")
    url = broker.url
    out = run_ssb("view", "service_queues", "--url", url).stdout
    assert "Orders" in out and "messages_ready" in out
    out = run_ssb("view", "queue:Orders", "--url", url).stdout
    assert "hello" in out and "conversation_handle" in out
    result = run_ssb("view", "nonsense", "--url", url)
    assert result.returncode == 1 and "there is no view 'nonsense'" in result.stderr
    out = run_ssb("status", "--url", url).stdout
    assert broker.instance in out


def test_bad_config_is_reported(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.toml"
    bad.write_text("durabilty = 'os'\n")
    result = run_ssb("serve", "--config", str(bad), "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 2
    assert "unknown setting 'durabilty'" in result.stderr
    for text, said in (
        ("data_dir = 5\n", "data_dir must be a path in quotes, not 5"),
        ("[transport]\naccept_rate = -1\n", "accept_rate must be a number from 0.1 to"),
        ("busy_poll = 0.5\n", "busy_poll must be a number of seconds from 0 (off) to 0.01"),
    ):
        bad.write_text(text)
        result = run_ssb("serve", "--config", str(bad), "--data-dir", str(tmp_path / "d"))
        assert result.returncode == 2 and said in result.stderr
        assert "Traceback" not in result.stderr


def test_second_daemon_on_same_data_dir_is_refused(broker: BrokerProcess) -> None:
    result = run_ssb(
        "serve", "--data-dir", str(broker.data_dir), "--client-port", "0", "--broker-port", "0"
    )
    assert result.returncode == 2
    assert "another ssb daemon is using" in result.stderr
    assert (broker.data_dir / "broker.json").exists()  # the running daemon's stays


def test_a_daemon_whose_picked_port_was_taken_meanwhile_starts_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race of concurrent test runs: a port free when picked, taken before the daemon
    listens. The daemon says so and the test tools pick again."""

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        monkeypatch.setattr(_daemon, "free_port", lambda: next(ports, None) or tools.free_port())
        broker = BrokerProcess(tmp_path / "data").start()
        try:
            assert broker.client_port != taken.getsockname()[1]
            assert "Address already in use" in broker.log_text()
            with client.connect_sync(broker.url) as conn:
                assert conn.ping()
        finally:
            broker.kill()
