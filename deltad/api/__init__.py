"""The inbox over HTTP: a JSON API, an event stream, notifications and a web page, served by
`deltad serve` in a thread beside the loop (the shape of gunicorn's control API: a package of its
own, handlers that read the disk and write answers through `deltad.inbox`, the one answering
path). Only `config`, `tokens`, `scopes` and `links` are imported without the ASGI stack.
"""
