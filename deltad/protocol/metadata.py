"""Reading and writing `metadata.json`; every status change is checked and logged here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog
from pydantic import ValidationError

from .errors import CorruptFile, UnsafeFile
from .fsio import atomic_write, read_regular
from .models import RunMetadata, utcnow
from .process import current_owner
from .states import RunStatus, check_transition

log = structlog.get_logger("deltad.protocol")

_MAX_METADATA_BYTES = 1024 * 1024


def new_metadata(
    run_id: str,
    task: str,
    agent_ref: str,
    *,
    pipeline: str | None = None,
    max_iterations: int | None = None,
) -> RunMetadata:
    """A run as it starts: RUNNING, owned by this process."""
    now = utcnow()
    return RunMetadata(
        run_id=run_id,
        status=RunStatus.RUNNING,
        task=task,
        agent_ref=agent_ref,
        pipeline=pipeline,
        start_time=now,
        updated_at=now,
        max_iterations=max_iterations,
        owner=current_owner(),
    )


def load_metadata(path: Path) -> RunMetadata:
    """Raises FileNotFoundError, or CorruptFile with the reason in one line."""
    try:
        raw = read_regular(path, _MAX_METADATA_BYTES)
    except UnsafeFile as e:
        raise CorruptFile(str(e)) from None
    try:
        return RunMetadata.model_validate_json(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise CorruptFile(f"{path}: {where}: {first['msg']}") from None
    except (ValueError, RecursionError):
        raise CorruptFile(f"{path}: not a valid metadata file") from None


def save_metadata(path: Path, meta: RunMetadata) -> None:
    meta.updated_at = utcnow()
    atomic_write(path, (meta.model_dump_json(indent=2) + "\n").encode())


def transition(
    path: Path, meta: RunMetadata, to: RunStatus, *, workspace: str = "", **changes: Any
) -> RunMetadata:
    """Move `meta` to status `to` (checked against the table), apply `changes`, persist, log."""
    check_transition(meta.status, to)
    before = meta.status
    for key, value in changes.items():
        setattr(meta, key, value)
    meta.status = to
    save_metadata(path, meta)
    log.info(
        "status_transition",
        run_id=meta.run_id,
        workspace=workspace,
        **{"from": str(before), "to": str(to)},
        reason=changes.get("error"),
    )
    return meta
