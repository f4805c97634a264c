"""Privilege separation: the root core's side of the inbox process, and the wire between them
(docs/design.md, "Two processes"). `wire` is the protocol (shared with `deltad.http`),
`monitor` the core's answer to a call (an operation of deltad/inbox/ops.py's table), `core`
the connection and the supervisor, `handoff` the core's writes into the inbox's outbox.
The inbox process itself is `deltad.http`.
"""
