"""Event notifications: QUEUE_ACTIVATION, BROKER_QUEUE_DISABLED and POISON_MESSAGE.

Theory of operation. An event posts an EventNotification message (body: an
EVENT_INSTANCE naming the event, the queue, this broker and the time) to the
notification's service, on the contract PostEventNotification. Each notification keeps
one dialog and reuses it for every event, so a listener sees its events in order on one
conversation; when that dialog is gone (the listener ended it) the next event begins a
new one. Only services of this broker are notified; an event for a service elsewhere, or
one whose queue is OFF, is logged and dropped (events are not messages anyone sent).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from . import catalog as cat
from .conversations import CAN_SEND
from .delivery import Delivery
from .endpoints import Endpoints
from .names import database_of, plain
from .ports import Clock
from .routes import Routes
from .transmission import Outbound

log = logging.getLogger("ssb.core")


@dataclass(eq=False)
class Events:
    clock: Clock
    catalog: cat.Catalog
    routes: Routes
    endpoints: Endpoints
    delivery: Delivery
    instance_id: str
    # notification name -> its dialog's target handle
    dialogs: dict[str, uuid.UUID] = field(init=False, default_factory=dict)

    def fire(self, event: str, queue_name: str) -> int:
        """Post an EventNotification for `event` on `queue_name`; returns how many."""
        fired = 0
        for note in list(self.catalog.notifications.values()):
            if note.event != event or note.queue != queue_name:
                continue
            self.post(note, self.body(event, queue_name))
            fired += 1
        return fired

    def body(self, event: str, queue_name: str, details: str = "") -> bytes:
        """The EventNotification body: EVENT_INSTANCE naming event, queue, broker, time."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.clock.time()))
        return (
            f"<EVENT_INSTANCE><EventType>{event}</EventType><PostTime>{stamp}Z</PostTime>"
            f"<BrokerInstance>{self.instance_id}</BrokerInstance>"
            f"<ObjectName>{escape(plain(queue_name))}</ObjectName><ObjectType>QUEUE</ObjectType>"
            f"{details}</EVENT_INSTANCE>"
        ).encode()

    def post(self, note: cat.EventNotification, body: bytes) -> None:
        """Deliver on the notification's own dialog (one per notification, reused)."""
        now = self.clock.time()
        handle = self.dialogs.get(note.name)
        ep = self.endpoints.get(handle) if handle else None
        service = self.routes.local_target(
            note.service, note.broker_instance, database_of(note.queue)
        )
        reason = self.delivery.local_block(service or note.service)
        if ep is None or ep.state not in CAN_SEND:
            if service is None:
                log.warning(
                    "event notification %s: service %s is not on this broker; event dropped",
                    note.name,
                    note.service,
                )
                return
            if reason:
                log.warning("event notification %s not delivered: %s", note.name, reason)
                return
            conversation_id = uuid.uuid4()
            out = Outbound(
                0,
                uuid.uuid4(),
                conversation_id,
                service,
                note.broker_instance,
                plain(note.name),
                cat.POST_EVENT_NOTIFICATION,
                True,
                0,
                cat.EVENT_NOTIFICATION,
                "X",
                body,
                now,
                5,
            )
            self.delivery.deliver_local(out, now)
            target = self.endpoints.by_conversation(conversation_id, False)
            if target is not None:
                self.dialogs[note.name] = target.handle
            return
        if reason:
            log.warning("event notification %s not delivered: %s", note.name, reason)
            return
        ep.receive_seq += 1
        self.delivery.enqueue(ep, ep.receive_seq - 1, cat.EVENT_NOTIFICATION, "X", body, now)
        self.endpoints.update(ep)

    def dropped(self, name: str) -> None:
        self.dialogs.pop(name, None)
