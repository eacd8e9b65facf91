"""Databases in the core, without a daemon: namespaces, the local route across databases,
USE, DROP / ALTER DATABASE, procedures in the catalog, and that they outlive a restart.

Names are qualified as the client port qualifies them (`_namespaces.Namespaces`), so a
session in a database names its objects plainly, as a script does.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from ssb.broker._core import names
from ssb.broker._core.catalog import ERROR
from ssb.broker._core.transactions import Session
from ssb.broker._errors import BrokerError
from ssb.broker._namespaces import Namespaces
from ssb.protocol import ErrorCode

from .core_harness import BODY, HANDLE, MTYPE, Core

SERVICE_NAME = 6  # RECEIVE row columns
CONTRACT = 7


def call(core: Core, session: Session, operation: str, **arguments: Any) -> Any:
    """An operation as a client sends it: its names qualified in the session's database."""
    Namespaces(core.engine.catalog).qualify(session, operation, arguments)
    return core.engine.operations()[operation](session, **arguments)


def in_database(core: Core, database: str) -> Session:
    session = core.new_session()
    call(core, session, "use", database=database)
    return session


def objects(core: Core, session: Session, queue: str, service: str, target: bool) -> None:
    """A request/reply contract, a queue and a service, as each tutorial database has."""
    call(core, session, "create_message_type", name="Request")
    call(core, session, "create_message_type", name="Reply")
    call(
        core,
        session,
        "create_contract",
        name="Contract",
        messages={"Request": "INITIATOR", "Reply": "TARGET"},
    )
    call(core, session, "create_queue", name=queue)
    contracts = ["Contract"] if target else []
    call(core, session, "create_service", name=service, queue=queue, contracts=contracts)


@pytest.fixture
def core() -> Core:
    core = Core()
    for database in ("Target", "Initiator"):
        core.op("create_database", database)
    return core


def test_keys_are_plain_in_master_and_qualified_elsewhere() -> None:
    assert names.qualify("master", "Q") == "Q"
    key = names.qualify("Sales", "//a/b.c")
    assert names.split(key) == ("Sales", "//a/b.c")
    assert (names.plain(key), names.database_of(key), names.database_of("Q")) == (
        "//a/b.c",
        "Sales",
        "master",
    )
    assert names.shown(key, "Sales") == "//a/b.c"
    assert names.shown(key, "master") == "Sales.//a/b.c"
    session = Session(database="Sales")
    assert Namespaces.shown(session, f"queue '{names.qualify('Sales', 'Q')}' is gone") == (
        "queue 'Q' is gone"
    )


def test_same_names_in_two_databases_and_a_dialog_between_them(core: Core) -> None:
    target, initiator = in_database(core, "target"), in_database(core, "Initiator")
    assert target.database == "Target"  # USE finds a database without case
    objects(core, target, "Queue", "//Tgt/Service", target=True)
    objects(core, initiator, "Queue", "//Init/Service", target=False)
    # no route: the service is found in the other database, as the local route finds it
    handle = call(
        core,
        initiator,
        "begin_dialog",
        from_service="//Init/Service",
        to_service="//Tgt/Service",
        contract="Contract",
    )
    call(core, initiator, "send", handles=[handle], message_type="Request", bodies=[b"<r/>"])
    (row,) = call(core, target, "receive", queue="Queue")
    assert (row[SERVICE_NAME], row[CONTRACT], row[MTYPE], row[BODY]) == (
        "//Tgt/Service",
        "Contract",
        "Request",
        b"<r/>",
    )
    far = core.engine.endpoints.get(row[HANDLE])
    assert far is not None and far.service == names.qualify("Target", "//Tgt/Service")
    databases = core.engine.catalog.databases
    assert far.far_broker_instance == databases["Initiator"].service_broker_guid
    mine = core.engine.endpoints.get(handle)
    assert mine is not None and mine.far_broker_instance == databases["Target"].service_broker_guid
    call(core, target, "send", handles=[row[HANDLE]], message_type="Reply", bodies=[b"<a/>"])
    call(core, target, "end_conversation", handle=row[HANDLE])
    got = call(core, initiator, "receive", queue="Queue")
    assert [(r[MTYPE], r[BODY]) for r in got] == [
        ("Reply", b"<a/>"),
        ("http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog", b""),
    ]
    call(core, initiator, "end_conversation", handle=handle)
    core.flush()
    assert core.engine.endpoints.page(None, 10) == []
    # a session sees only its database's objects and handles
    with pytest.raises(BrokerError) as refused:
        call(core, target, "end_conversation", handle=handle)
    assert refused.value.code == ErrorCode.UNKNOWN_CONVERSATION


def test_the_sending_database_first_then_master_then_the_others(core: Core) -> None:
    target, initiator = in_database(core, "Target"), in_database(core, "Initiator")
    for session, queue in ((target, "TQ"), (initiator, "IQ"), (core.session, "MQ")):
        call(core, session, "create_queue", name=queue)
        call(core, session, "create_service", name="S", queue=queue, contracts=["DEFAULT"])
    routes = core.engine.routes
    assert routes.local_target("S", None, "Target") == names.qualify("Target", "S")
    assert routes.local_target("S", None, "master") == "S"
    call(core, core.session, "drop", kind="service", name="S")
    assert routes.local_target("S", None, "master") == names.qualify("Target", "S")  # by id
    guid = core.engine.catalog.databases["Initiator"].service_broker_guid
    assert routes.local_target("S", guid, "Target") == names.qualify("Initiator", "S")
    assert routes.local_target("S", str(uuid.uuid4()), "Target") is None  # another broker
    # a LOCAL route naming a database's broker instance leads there
    core.op("create_route", "R", "S", "LOCAL", broker_instance=guid)
    assert routes.local_target("S", None, "Target") == names.qualify("Initiator", "S")


def test_a_name_may_not_name_another_database(core: Core) -> None:
    with pytest.raises(BrokerError, match="control characters"):
        call(core, core.session, "create_queue", name=names.qualify("Target", "Q"))


def test_drop_database_ends_its_conversations_and_forgets_everything(core: Core) -> None:
    target, initiator = in_database(core, "Target"), in_database(core, "Initiator")
    objects(core, target, "Queue", "T", target=True)
    objects(core, initiator, "Queue", "I", target=False)
    handle = call(
        core, initiator, "begin_dialog", from_service="I", to_service="T", contract="Contract"
    )
    call(core, initiator, "send", handles=[handle], message_type="Request", bodies=[b"<r/>"])
    with pytest.raises(BrokerError) as busy:
        call(core, core.session, "drop_database", name="Target")
    assert busy.value.code == ErrorCode.IN_USE  # a session uses it
    core.engine.transactions.close_session(target)
    call(core, core.session, "drop_database", name="target")
    got = call(core, initiator, "receive", queue="Queue")
    assert [r[MTYPE] for r in got] == [ERROR]
    assert b"<Code>-8490</Code>" in got[0][BODY]
    catalog = core.engine.catalog
    assert "Target" not in catalog.databases
    assert not [k for k in catalog.message_types if names.database_of(k) == "Target"]
    assert names.qualify("Target", "Queue") not in core.engine.queues
    with pytest.raises(BrokerError) as system:
        call(core, core.session, "drop_database", name="master")
    assert system.value.code == ErrorCode.SYSTEM_OBJECT


def test_new_broker_removes_conversations_and_changes_the_guid(core: Core) -> None:
    target = in_database(core, "Target")
    call(core, target, "create_queue", name="Q")
    call(core, target, "create_service", name="S", queue="Q", contracts=["DEFAULT"])
    handle = call(core, target, "begin_dialog", from_service="S", to_service="S")
    call(core, target, "send", handles=[handle], bodies=[b"x"])
    before = core.engine.catalog.databases["Target"].service_broker_guid
    call(core, core.session, "alter_database", name="Target", broker="NEW_BROKER", trustworthy=True)
    after = core.engine.catalog.databases["Target"]
    assert after.service_broker_guid != before and after.is_trustworthy_on
    assert call(core, target, "receive", queue="Q") == []  # nothing left, nobody told
    core.flush()
    assert core.engine.endpoints.page(None, 10) == []
    with pytest.raises(BrokerError, match="master keeps its service_broker_guid"):
        call(core, core.session, "alter_database", name="master", broker="NEW_BROKER")
    with pytest.raises(BrokerError, match="is not supported by ssb"):
        call(core, core.session, "alter_database", name="Target", broker="DISABLE_BROKER")


def test_procedures_are_per_database_without_case_and_outlive_a_restart(core: Core) -> None:
    target = in_database(core, "Target")
    text = "CREATE PROCEDURE Work AS PRINT 1"
    call(core, target, "create_procedure", name="Work", text=text)
    with pytest.raises(BrokerError) as taken:
        call(core, target, "create_procedure", name="WORK", text=text)
    assert taken.value.code == ErrorCode.ALREADY_EXISTS
    call(
        core, core.session, "create_procedure", name="work", text="CREATE PROCEDURE work AS RETURN"
    )
    assert call(core, target, "procedure", name="wOrK") == {"name": "Work", "text": text}
    call(core, target, "alter_procedure", name="work", text="ALTER PROCEDURE Work AS PRINT 2")
    # a queue of the database may name it for activation
    call(
        core,
        target,
        "create_queue",
        name="Q",
        activation={"status": "ON", "procedure": "WORK", "max_queue_readers": 2},
    )
    activation = core.engine.catalog.queues[names.qualify("Target", "Q")].activation
    assert activation.procedure == names.qualify("Target", "Work")
    core.flush()
    again = core.restart()
    catalog = again.engine.catalog
    assert set(catalog.databases) == {"master", "Target", "Initiator"}
    found = catalog.find_procedure(names.qualify("Target", "work"))
    assert found is not None and found.text == "ALTER PROCEDURE Work AS PRINT 2"
    session = in_database(again, "Target")
    call(again, session, "drop", kind="procedure", name="WORK")
    assert catalog.find_procedure(names.qualify("Target", "Work")) is None
    assert catalog.find_procedure("work") is not None  # master's
