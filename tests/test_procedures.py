"""No code injection: workers run only the functions the operator listed in `procedures`."""

from __future__ import annotations

from pathlib import Path

import pytest
from daemon import BrokerProcess
from test_scheduler import activation, warm

from ssb import client
from ssb.broker._procedures import ProcedurePolicy


def test_patterns_match_module_function_or_module() -> None:
    policy = ProcedurePolicy(["myapp.tasks.*", "reports:daily", "jobs"])
    assert policy.allows("myapp.tasks:run") and policy.allows("myapp.tasks.sub:run")
    assert policy.allows("reports:daily") and not policy.allows("reports:weekly")
    assert policy.allows("jobs:anything") and not policy.allows("jobs.inner:x")
    assert not policy.allows("os:system") and not policy.allows("myapp:run")
    assert policy.allows("ssb.client._scheduler:run_tasks")  # the scheduler's own reader
    assert not ProcedurePolicy([]).allows("os:system")


@pytest.fixture
def pbroker(tmp_path: Path) -> BrokerProcess:
    process = BrokerProcess(
        tmp_path / "data",
        durability="os",
        config={"activation": activation(1), "procedures": ["activation_procs:*"]},
    ).start()
    yield process  # type: ignore[misc]
    process.kill()


async def test_a_queue_cannot_activate_an_unlisted_function(pbroker: BrokerProcess) -> None:
    async with await client.connect(pbroker.url) as conn:
        bad = {"status": "ON", "procedure": "os:system", "max_queue_readers": 1}
        with pytest.raises(client.PermissionDeniedError, match="procedures = "):
            await conn.create_queue("Q", activation=bad)
        assert not [q for q in await conn.view("service_queues") if q["name"] == "Q"]
        await conn.create_queue("Q")
        with pytest.raises(client.PermissionDeniedError, match="'os:system'"):
            await conn.alter_queue("Q", activation=bad)
        (row,) = [q for q in await conn.view("service_queues") if q["name"] == "Q"]
        assert not row["activation_procedure"]
    assert "refused activation procedure 'os:system'" in pbroker.log_text()


async def test_a_scheduler_task_cannot_name_an_unlisted_function(
    pbroker: BrokerProcess, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    async with await client.connect(pbroker.url) as conn:
        await warm(conn, 1)
        scheduler = await conn.get_scheduler(max_queue_readers=1)
        await scheduler.exec_async("os:system", f"touch {marker}")
        await scheduler.exec_async("activation_procs:failing_task", "allowed")
        first, second = sorted(await scheduler.synchronize(timeout=30), key=lambda o: o.log_id)
    assert not first.ok and "'os:system' is not one the broker may run" in (first.error or "")
    assert second.error == "ValueError: allowed"  # listed: it ran (and raised)
    assert not marker.exists()
