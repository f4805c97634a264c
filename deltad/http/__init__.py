"""What runs as the inbox's user (`deltad-inbox`), and only that: the HTTP API, the event stream,
the web page, MCP, and the process's entry (`python -m deltad.http`, started by the core or by
deltad-inbox.service). It parses the network and holds nothing the core trusts: every call
reaches the root core over the privsep socket (`deltad.wire`), which re-checks it.

    child.py        the process: the core's socket, the courier threads, the ASGI server
    app.py          the routes; mcp_adapter.py, mcp_gate.py the MCP endpoint
    server.py, gate.py, limits.py, access.py, problems.py, sessions.py   serving and admission

Kept free of imports: `python -m deltad.http` sets no_new_privs before anything is loaded.
"""
