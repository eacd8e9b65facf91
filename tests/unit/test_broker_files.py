"""The files a broker's first start makes, kept in its store (broker/_broker_files.py):
the store's copy wins, names outside the kept ones are never written, and a forgotten
file stays forgotten."""

from __future__ import annotations

from pathlib import Path

from ssb.broker._broker_files import BrokerFiles
from ssb.broker._store import SQLiteStore


def _files(folder: Path, store: SQLiteStore, own_tls: bool = True) -> BrokerFiles:
    folder.mkdir(exist_ok=True)
    return BrokerFiles(folder, store, own_tls)


def test_a_new_data_directory_gets_the_stores_files_and_nothing_else(tmp_path: Path) -> None:
    store = SQLiteStore(":memory:", threaded=False)
    first = _files(tmp_path / "first", store)
    (first.data_dir / "broker-key.pem").write_text("key")
    (first.data_dir / "admin.password").write_text("secret\n")
    (first.data_dir / "broker.json").write_text("{}")  # a daemon's own: not kept
    first.restore()
    first.save()
    store.flush()
    assert store.load_broker_files() == {"broker-key.pem": "key", "admin.password": "secret\n"}

    second = _files(tmp_path / "second", store)
    (second.data_dir / "broker-key.pem").write_text("another key")  # the store's wins
    (second.data_dir / "broker-key.next.pem").write_text("stale")  # the store has none
    second.restore()
    assert (second.data_dir / "broker-key.pem").read_text() == "key"
    assert (second.data_dir / "admin.password").read_text() == "secret\n"
    assert (second.data_dir / "admin.password").stat().st_mode & 0o777 == 0o600
    assert not (second.data_dir / "broker-key.next.pem").exists()
    assert not (second.data_dir / "broker.json").exists()


def test_a_name_that_is_no_broker_file_is_never_written(tmp_path: Path) -> None:
    store = SQLiteStore(":memory:", threaded=False)
    store.put_broker_file("../escaped.pem", "x")
    store.put_broker_file("notes.txt", "x")
    store.flush()
    files = _files(tmp_path / "data", store)
    files.restore()
    assert list(files.data_dir.iterdir()) == []
    assert not (tmp_path / "escaped.pem").exists()


def test_the_tls_pair_is_kept_only_when_it_is_the_brokers_own(tmp_path: Path) -> None:
    store = SQLiteStore(":memory:", threaded=False)
    files = _files(tmp_path / "data", store, own_tls=False)
    (files.data_dir / "tls-key.pem").write_text("operator's")
    files.restore()
    files.save()
    store.flush()
    assert store.load_broker_files() == {}


def test_a_forgotten_file_is_neither_restored_nor_saved_again(tmp_path: Path) -> None:
    store = SQLiteStore(":memory:", threaded=False)
    files = _files(tmp_path / "data", store)
    (files.data_dir / "admin.password").write_text("first\n")
    files.restore()
    files.save()
    files.forget("admin.password")
    files.save()
    store.flush()
    assert store.load_broker_files() == {"admin.password": ""}
    again = _files(tmp_path / "other", store)
    (again.data_dir / "admin.password").write_text("mine\n")
    again.restore()
    again.save()
    store.flush()
    assert (again.data_dir / "admin.password").read_text() == "mine\n"
    assert store.load_broker_files() == {"admin.password": ""}
