"""The broker's core: Service Broker's model, with no SQL, sockets or clock of its own.

`engine.Engine` builds the parts and wires them; `ports` says what the core needs from
the world (a journal, a clock, a queue listener, an outbound sink).
"""
