"""structlog configuration shared by `delta` and `deltad`.

JSON lines (ISO-8601 UTC `timestamp`, `level`, `logger`, `event`) in production, a console
renderer on a TTY. Standard-library records (watchdog, httpx, openai) go through the same
processors. Tracebacks are rendered without locals: locals hold prompts, answers and keys.
Names are bytes: a path (and the value of a key that names one) is rendered with `show_path`,
so two workspaces never log alike; any other string with an undecodable byte is `show`n; on a
terminal every string is (no control character from a file reaches it).
"""

from __future__ import annotations

import logging
import sys
from os import PathLike
from typing import IO, Any, Literal

import structlog

from deltad.protocol.printable import json_safe, show, show_path

Format = Literal["json", "console", "auto"]

_SHARED: list[structlog.types.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


# Keys whose string value is a file or directory name.
NAME_KEYS = frozenset({"workspace", "path", "root", "dir", "file", "state_dir", "log"})
# Rendered apart by the console renderer (a multi-line traceback stays multi-line).
_AS_IS = frozenset({"event", "level", "logger", "timestamp", "exception"})


def _value(key: str, value: Any, terminal: bool) -> Any:
    if isinstance(value, PathLike) or (key in NAME_KEYS and isinstance(value, str | bytes)):
        return show_path(value)
    if terminal and isinstance(value, str) and key not in _AS_IS:
        return show(value)
    return json_safe(value)


def _names(terminal: bool) -> structlog.types.Processor:
    def escape(_: Any, __: str, event: structlog.types.EventDict) -> structlog.types.EventDict:
        return {k: _value(k, v, terminal) for k, v in event.items()}

    return escape


def _renderer(fmt: Format, stream: IO[str]) -> list[structlog.types.Processor]:
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    if fmt == "console":
        return [_names(True), structlog.dev.ConsoleRenderer(colors=stream.isatty())]
    return [_names(False), structlog.processors.JSONRenderer()]


def configure(level: str = "info", fmt: Format = "auto", stream: IO[str] | None = None) -> None:
    stream = stream or sys.stderr
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            ),
            *_renderer(fmt, stream),
        ],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The HTTP stack is chatty at INFO; its warnings still come through.
    for name in ("httpx", "httpx2", "httpcore", "openai"):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    # watchdog logs one DEBUG line per filesystem event, working files included: at debug that
    # is O(files) log volume and CPU. Its overflow warning still comes through.
    logging.getLogger("watchdog").setLevel(max(logging.INFO, root.level))
