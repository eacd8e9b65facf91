"""Group commit: the store thread writes the next batch while the loop runs what waited
for the last one."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ssb.broker._store import Store


async def test_the_next_commit_starts_before_the_last_ones_callbacks_run(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "broker.db", "fsync")  # every commit on the store thread
    failures: list[BaseException] = []
    store.attach(asyncio.get_running_loop(), failures.append)
    try:
        store.put_meta("first", "1")
        first = store.watermark()
        await asyncio.sleep(0)  # the commit of `first` starts on the store thread
        store.put_meta("second", "2")  # waits in the next batch meanwhile
        second = store.watermark()
        assert second == first + 1
        seen = asyncio.get_running_loop().create_future()

        def write_again() -> None:
            store.put_meta("third", "3")
            seen.set_result(store.watermark())

        store.when_durable(first, write_again)
        # when `first`'s callbacks run, `second` is already taken for the next commit:
        # what they write goes in the batch after it
        third = await asyncio.wait_for(seen, 30)
        assert third == second + 1
        done = asyncio.get_running_loop().create_future()
        store.when_durable(third, lambda: done.set_result(None))
        await asyncio.wait_for(done, 30)
        assert not failures
    finally:
        await store.close()
