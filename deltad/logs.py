"""structlog configuration shared by `delta` and `deltad`.

JSON lines (ISO-8601 UTC `timestamp`, `level`, `logger`, `event`) in production, a console
renderer on a TTY. Standard-library records (watchdog, httpx, openai) go through the same
processors. Tracebacks are rendered without locals: locals hold prompts, answers and keys.
"""

from __future__ import annotations

import logging
import sys
from typing import IO, Literal

import structlog

Format = Literal["json", "console", "auto"]

_SHARED: list[structlog.types.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def _renderer(fmt: Format, stream: IO[str]) -> structlog.types.Processor:
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    if fmt == "console":
        return structlog.dev.ConsoleRenderer(colors=stream.isatty())
    return structlog.processors.JSONRenderer()


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
            _renderer(fmt, stream),
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
