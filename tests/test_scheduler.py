"""The seed-000 scheduler on a real daemon: tasks on activated readers, synchronize,
the execution log and status, the per-scheduler limit and fairness between schedulers."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from daemon import BrokerProcess

from ssb import client
from ssb.tools import wait_until

TESTS = Path(__file__).parent
Rows = list[dict[str, Any]]


def activation(workers: int) -> dict[str, Any]:
    return {
        "check_interval": 0.2,
        "empty_rowset_window": 0.5,
        "prestart_workers": workers,
        "idle_workers": workers,
        "python_path": [str(TESTS)],
    }


@pytest.fixture
def broker_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The tests' broker: `workers` warm activation workers (indirect parameter, default 5)."""
    workers = getattr(request, "param", 5)
    return {"durability": "os", "config": {"activation": activation(workers)}}


async def warm(conn: client.Connection, count: int) -> None:
    """Wait for the prestarted workers, so timings measure tasks, not process starts."""
    await wait_until(
        lambda: conn.view("activation_workers"),
        f"{count} idle workers",
        20,
        until=lambda r: sum(w["state"] == "IDLE" for w in r) >= count,
    )


def when(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def log_of(rows: Rows, handle: Any) -> Rows:
    return [r for r in rows if r["scheduler_handle"] == handle]


def max_overlap(rows: Rows) -> int:
    edges = sorted(
        [(when(r["start_time"]), 1) for r in rows] + [(when(r["end_time"]), -1) for r in rows]
    )
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.parametrize("broker_settings", [4], indirect=True)
async def test_four_tasks_run_concurrently_on_four_readers(conn: client.Connection) -> None:
    await warm(conn, 4)
    scheduler = await conn.get_scheduler(max_queue_readers=4)
    started = time.monotonic()
    ids = [await scheduler.exec_async("activation_procs:sleep_task", 1.0) for _ in range(4)]
    outcomes = await scheduler.synchronize(timeout=20)
    elapsed = time.monotonic() - started
    log = log_of(await conn.view("execution_log"), scheduler.handle)
    # synchronize returned only once all four had ended
    assert sorted(o.log_id for o in outcomes) == sorted(ids)
    assert all(o.ok and o.result == 1.0 for o in outcomes)
    assert [r["status"] for r in log] == ["DONE"] * 4
    assert elapsed < 2.5, f"4 x 1 s took {elapsed:.2f} s: not concurrent"
    assert max_overlap(log) == 4
    assert len({r["pid"] for r in log}) == 4
    assert len({r["activated_task"] for r in log}) == 4
    assert all(r["task"] == "activation_procs:sleep_task(1.0)" for r in log)
    await scheduler.release()


async def test_six_schedulers_on_five_readers_all_finish(
    broker: BrokerProcess, conn: client.Connection
) -> None:
    await warm(conn, 5)
    await conn.install_scheduler("Shared", max_queue_readers=5)
    connections = [await client.connect(broker.url) for _ in range(6)]
    try:
        schedulers = [await c.get_scheduler("Shared") for c in connections]

        async def run(scheduler: client.Scheduler) -> list[client.TaskOutcome]:
            for _ in range(3):
                await scheduler.exec_async("activation_procs:sleep_task", 0.2)
            return await scheduler.synchronize(timeout=30)

        results = await asyncio.gather(*(run(s) for s in schedulers))
    finally:
        for c in connections:
            await c.close()
    assert [len(r) for r in results] == [3] * 6
    assert all(o.ok for r in results for o in r)
    log = await conn.view("execution_log")
    starts = {
        s.handle: sorted(when(r["start_time"]) for r in log_of(log, s.handle)) for s in schedulers
    }
    # oldest waiting first: every scheduler's first task started before anyone's last
    last_start = max(t for times in starts.values() for t in times)
    assert all(times[0] < last_start for times in starts.values())
    assert max_overlap(log) <= 5


async def test_max_running_limits_a_schedulers_running_tasks(conn: client.Connection) -> None:
    await warm(conn, 5)
    scheduler = await conn.get_scheduler(max_queue_readers=5, max_running=2)
    for _ in range(6):
        await scheduler.exec_async("activation_procs:sleep_task", 0.2)
        assert scheduler.outstanding <= 2
    outcomes = await scheduler.synchronize(timeout=20)
    assert len(outcomes) == 6
    log = log_of(await conn.view("execution_log"), scheduler.handle)
    assert max_overlap(log) == 2
    await scheduler.release()


async def test_failures_are_logged_and_a_dead_worker_is_reported(
    conn: client.Connection,
) -> None:
    await warm(conn, 2)
    scheduler = await conn.get_scheduler(max_queue_readers=2)
    await scheduler.exec_async("activation_procs:failing_task", "boom")
    (outcome,) = await scheduler.synchronize(timeout=20)
    assert not outcome.ok and outcome.error == "ValueError: boom"
    log_id = await scheduler.exec_async("activation_procs:sleep_task", 30.0)
    status = await wait_until(
        lambda: conn.view("execution_status"),
        "the task in execution_status",
        20,
        until=lambda rows: any(r["log_id"] == log_id for r in rows),
    )
    (running,) = [r for r in status if r["log_id"] == log_id]
    assert running["task"] == "activation_procs:sleep_task(30.0)"
    os.kill(running["pid"], signal.SIGKILL)
    (outcome,) = await scheduler.synchronize(timeout=10)  # the broker answers for the dead
    assert outcome.log_id == log_id and not outcome.ok
    assert "ended before the task did" in (outcome.error or "")
    assert "SIGKILL" in (outcome.error or "")
    log = {r["log_id"]: r for r in await conn.view("execution_log")}
    assert log[log_id]["status"] == "FAILED" and log[log_id]["end_time"] is not None
    assert log[log_id - 1]["error"] == "ValueError: boom"
    # the scheduler goes on working
    await scheduler.exec_async("activation_procs:worker_pid")
    (outcome,) = await scheduler.synchronize(timeout=20)
    assert outcome.ok and outcome.result != running["pid"]
    await scheduler.release()


async def test_sync_scheduler(broker: BrokerProcess, conn: client.Connection) -> None:
    await warm(conn, 2)

    def work() -> list[client.TaskOutcome]:
        with (
            client.connect_sync(broker.url) as blocking,
            blocking.get_scheduler("Blocking", max_queue_readers=2) as scheduler,
        ):
            scheduler.exec_async("activation_procs:worker_pid")
            scheduler.exec_async("activation_procs:sleep_task", seconds=0.1)
            return scheduler.synchronize(timeout=20)

    outcomes = await asyncio.to_thread(work)
    assert len(outcomes) == 2 and all(o.ok for o in outcomes)
    with pytest.raises(ValueError, match=r"__main__|cannot be named"):
        await (await conn.get_scheduler("Blocking")).exec_async(lambda: None)
    with pytest.raises(TypeError, match="JSON"):
        await (await conn.get_scheduler("Blocking")).exec_async("time:sleep", object())
