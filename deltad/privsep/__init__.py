"""Privilege separation: the root core's side of the inbox process, and the wire between them
(docs/design.md, "Two processes"). `wire` is the protocol (shared with `deltad.http`), `core` the
core's side (the monitor, the supervisor), `handoff` the core's writes into the inbox's outbox.
The inbox process itself is `deltad.http`.
"""
