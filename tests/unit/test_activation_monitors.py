"""What the core tells activation's queue monitors, and what they keep for the manager.

No daemon: the engine on an in-memory store with a `Monitors` as its listener, as the
daemon builds it. The manager is not there; the test plays its part: it adds a monitor
for a queue (as its reconcile does) and looks at what was recorded (`take`).
"""

from __future__ import annotations

from ssb.broker._activation.monitor import (
    ExternalInput,
    ExternalTask,
    MonitorState,
    QueueMonitor,
)
from ssb.broker._activation.monitors import Monitors

from .core_harness import Core


def _core() -> tuple[Core, Monitors]:
    monitors = Monitors()
    core = Core(listener=monitors)
    core.services()
    monitors.take()  # the queues created: recorded as altered
    return core, monitors


def test_a_queue_without_a_monitor_records_nothing_when_messages_arrive() -> None:
    core, monitors = _core()
    core.op("send", core.dialog(), "DEFAULT", [b"one"])
    assert not monitors.wakeup.is_set()
    assert monitors.take().due == []


def test_arrivals_request_one_check_and_say_the_queue_was_empty() -> None:
    core, monitors = _core()
    monitor = monitors.by_queue["Target"] = QueueMonitor("Target")
    core.op("send", core.dialog(), "DEFAULT", [b"one"])
    core.op("send", core.dialog(), "DEFAULT", [b"two"])
    assert monitors.wakeup.is_set()
    recorded = monitors.take()
    assert recorded.due == [monitor]  # two arrivals, one check
    assert monitor.arrived_into_empty
    assert not monitors.wakeup.is_set()


def test_a_receive_moves_the_monitor_and_marks_the_task_arrived() -> None:
    core, monitors = _core()
    monitor = monitors.by_queue["Target"] = QueueMonitor("Target")
    core.op("send", core.dialog(), "DEFAULT", [b"one"])
    monitors.take()
    monitor.check_scheduled = False  # the manager checked it
    task = ExternalTask(1, "Target", "reader", "tester", "", 0.0, session=core.session)
    core.session.task = task
    core.op("receive", "Target")
    assert monitor.state is MonitorState.RECEIVES_OCCURRING
    assert task.received
    assert monitors.take().due == [monitor]


def test_altering_a_queue_is_recorded_for_the_manager() -> None:
    core, monitors = _core()
    core.op("alter_queue", "Target", retention="ON")
    core.op("create_queue", "Other")
    assert monitors.take().altered == ["Target", "Other"]


def test_a_reader_asked_to_stop_gets_nothing_and_its_closed_session_is_recorded() -> None:
    core, monitors = _core()
    core.op("send", core.dialog(), "DEFAULT", [b"one"])
    reader = core.new_session("reader")
    task = ExternalTask(1, "Target", "reader", "reader", "", 0.0, session=reader)
    reader.task = task
    assert not monitors.stopping(reader)
    task.feed(ExternalInput.STOP)
    assert monitors.stopping(reader)
    assert core.op("receive", "Target", session=reader) == []
    core.engine.transactions.close_session(reader)
    assert monitors.take().closed == [task]
