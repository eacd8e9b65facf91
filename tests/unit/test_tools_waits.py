"""The waits every test, benchmark and example uses: polling with a deadline, and a
command's ready line (ssb.tools)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ssb.tools import read_ready_line, wait_until, wait_until_sync


async def test_wait_until_returns_the_first_value_that_ends_the_wait() -> None:
    values = iter([0, [], 3, 4])

    async def probe() -> object:
        return next(values)

    assert await wait_until(probe, "a truthy value", 5, 0.001) == 3
    counts = iter(range(10))

    async def count() -> int:
        return next(counts)

    assert await wait_until(count, "two", 5, 0.001, until=lambda n: n >= 2) == 2


async def test_wait_until_fails_after_its_timeout_naming_what_and_the_last_value() -> None:
    async def never() -> list[str]:
        return ["still here"]

    with pytest.raises(
        AssertionError, match=r"0.05 s waiting for the queue to empty; last: \['still here'\]"
    ):
        await wait_until(never, "the queue to empty", 0.05, 0.01, until=lambda rows: not rows)


def test_wait_until_sync_polls_a_blocking_probe_the_same_way() -> None:
    values = iter(["", "", "done"])
    assert wait_until_sync(lambda: next(values), "done", 5, 0.001) == "done"
    with pytest.raises(AssertionError, match="waiting for a miracle; last: False"):
        wait_until_sync(lambda: False, "a miracle", 0.05, 0.01)


def _child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)


def test_read_ready_line_passes_over_earlier_lines() -> None:
    proc = _child("print('created the login'); print('ready here=1', flush=True); input()")
    try:
        assert read_ready_line(proc, "ready", 30) == "ready here=1"
    finally:
        proc.kill()
        proc.wait()


def test_read_ready_line_is_none_when_the_process_ends_first_or_stays_silent() -> None:
    ended = _child("print('failed to start')")
    assert read_ready_line(ended, "ready", 30) is None
    ended.wait()
    silent = _child("import time; time.sleep(30)")
    try:
        assert read_ready_line(silent, "ready", 0.2) is None
    finally:
        silent.kill()
        silent.wait()
