"""The async and the blocking client offer the same API: the same public methods and
properties, with the same parameters and docstrings, awaitable on one side and blocking
on the other. Likewise the async and the blocking scheduler handles."""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
from typing import Any

import pytest

from ssb import client

PAIRS = [
    (client.Connection, client.SyncConnection),
    (client.Scheduler, client.SyncScheduler),
]


def _public(cls: type) -> dict[str, Any]:
    return {name: inspect.getattr_static(cls, name) for name in dir(cls) if name[0] != "_"}


def _attributes(cls: type) -> set[str]:
    """Public attributes that `__init__` sets on an instance."""
    source = textwrap.dedent(inspect.getsource(cls.__init__))  # type: ignore[misc]
    return {
        node.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and node.attr[0] != "_"
    }


def _is_async(fn: Any) -> bool:
    """A coroutine function, or a function that gives an async context manager
    (`transaction`: a generator's, or an object made for it)."""
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(inspect.unwrap(fn)):
        return True
    gives = inspect.signature(fn, eval_str=True).return_annotation
    return inspect.isclass(gives) and inspect.iscoroutinefunction(
        getattr(gives, "__aenter__", None)
    )


def _parameters(fn: Any) -> list[tuple[str, Any, Any]]:
    """Names, kinds and defaults (types differ by design: awaitables, connection classes)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize(("async_cls", "sync_cls"), PAIRS, ids=lambda cls: cls.__name__)
def test_both_offer_the_same_methods(async_cls: type, sync_cls: type) -> None:
    async_api, sync_api = _public(async_cls), _public(sync_cls)
    assert sorted(async_api) == sorted(sync_api)
    assert _attributes(async_cls) == _attributes(sync_cls)


@pytest.mark.parametrize(("async_cls", "sync_cls"), PAIRS, ids=lambda cls: cls.__name__)
def test_each_method_agrees_with_its_twin(async_cls: type, sync_cls: type) -> None:
    async_api, sync_api = _public(async_cls), _public(sync_cls)
    for name in sorted(async_api.keys() & sync_api.keys()):
        mine, twin = async_api[name], sync_api[name]
        assert type(mine) is type(twin), name
        if isinstance(mine, property):
            assert mine.__doc__ == twin.__doc__, name
            continue
        assert inspect.getdoc(mine), f"{async_cls.__name__}.{name} has no docstring"
        assert inspect.getdoc(mine) == inspect.getdoc(twin), name
        assert _parameters(mine) == _parameters(twin), name
        assert _is_async(mine), f"{async_cls.__name__}.{name} blocks"
        assert not _is_async(twin), f"{sync_cls.__name__}.{name} is async"


def test_every_request_builder_is_a_method() -> None:
    """Each operation of the table is offered (the table is the client's API)."""
    from ssb.client import _calls as calls

    builders = {
        name
        for name, fn in vars(calls).items()
        if inspect.isfunction(fn) and fn.__module__ == calls.__name__ and fn.__name__ == name
    }
    builders = {name for name in builders if name[0] != "_"}
    builders -= {"encode_request", "transaction_outcome"}  # plumbing; the method takes an id
    assert builders <= _public(client.Connection).keys()


BAD_URLS = [
    "ssb://admin:s3cret-pw@127.0.0.1:99999",  # a bad port
    "ssb://admin:s3cret-pw@:4021",  # no host
    "ssb://admin:s3cret-pw@127.0.0.1:4021?nonsense=1",  # an unknown option
    "ssb://admin:s3cret-pw@127.0.0.1:4021?fingerprint=ab",  # needs ssbs://
    "ssbs://admin:s3cret-pw@127.0.0.1:4021?fingerprint=ab",  # not 64 hex digits
    "ssb://admin:s3cret-pw@[::1:4021",  # an IPv6 host without its closing bracket
    "ssb://admin:s3cret-pw@[no-address]:4021",  # brackets around what is no address
    "ssb://admin:s3cret-pw@[::1]:4021,[::2",  # the second of two hosts
    "admin:s3cret-pw@127.0.0.1:4021",  # no scheme
    "ssb://admin:s3cret-pw/x@127.0.0.1:4021",  # a / in the password, not percent-encoded
    "ssb://admin:s3cret-pw?x@127.0.0.1:4021",  # a ?
    "ssbs://admin:s3cret-pw#x@127.0.0.1:4021",  # a #
]


@pytest.mark.parametrize("url", BAD_URLS)
async def test_a_malformed_url_is_refused_without_showing_its_password(url: str) -> None:
    with pytest.raises(ValueError) as by_async:
        await client.connect(url)
    with pytest.raises(ValueError) as by_sync:
        client.connect_sync(url)
    for refused in (by_async.value, by_sync.value):
        assert "s3cret-pw" not in str(refused) and "admin:***@" in str(refused)
    assert str(by_async.value) == str(by_sync.value)


@pytest.mark.parametrize("url", [u for u in BAD_URLS if "[" in u])
def test_a_malformed_ipv6_host_is_refused_naming_the_url(url: str) -> None:
    with pytest.raises(ValueError) as refused:
        client.url_addresses(url)
    shown = url.replace("s3cret-pw", "***")
    assert str(refused.value).startswith(f"broker URL {shown!r} has a malformed IPv6 host")


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -1.0, 0, True, "10", 2**64])
async def test_a_bad_connect_timeout_is_refused_alike_by_both_clients(timeout: object) -> None:
    url = "ssb://admin:pw@127.0.0.1:1"  # nothing is dialled
    with pytest.raises(ValueError, match="timeout must be") as by_async:
        await client.connect(url, timeout=timeout)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be") as by_sync:
        client.connect_sync(url, timeout=timeout)  # type: ignore[arg-type]
    assert str(by_async.value) == str(by_sync.value)
