"""Privilege separation: the HTTP inbox in a process of its own, unprivileged, speaking to the
root core over one Unix socket (docs/design.md, "Two processes"). `wire` is the protocol,
`core` the core's side (the monitor, the supervisor), `child` the inbox process.

Kept free of imports: `python -m deltad.privsep` sets no_new_privs before anything is loaded.
"""
