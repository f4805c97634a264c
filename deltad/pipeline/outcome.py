"""What a node's handler returns (attractor spec §5.2): it drives edge selection and the context."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    SUCCESS = "success"
    PARTIAL_SUCCESS = "partial_success"
    RETRY = "retry"
    FAIL = "fail"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Outcome:
    status: Status
    preferred_label: str = ""
    suggested_next_ids: tuple[str, ...] = ()
    context_updates: Mapping[str, Any] = field(default_factory=dict)
    notes: str = ""
    failure_reason: str = ""


# -- a model's reply as an outcome (attractor §4.5, §5.2, Appendix C) -------------------------
STATUS_KEYS = ("outcome", "status")  # Appendix C names it `outcome`; §5.2's field is `status`
_FENCE = re.compile(r"```[ \t]*(?:json)?[ \t]*\n(.*?)\n?```", re.DOTALL | re.IGNORECASE)
_ALIASES = {"partial": Status.PARTIAL_SUCCESS, "failure": Status.FAIL, "failed": Status.FAIL}


def _status_block(text: str) -> dict[str, Any] | None:
    """The reply's status object: the whole reply, else its last fenced block, when it is a
    JSON object naming an outcome. Anything else is prose."""
    fenced = [m.group(1).strip() for m in _FENCE.finditer(text)]
    candidates = [text.strip(), *reversed(fenced)]
    for raw in candidates:
        if not raw.startswith("{"):
            continue
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        if isinstance(doc, dict) and any(k in doc for k in STATUS_KEYS):
            return doc
    return None


def _status(value: Any) -> Status | None:
    word = str(value).strip().casefold().replace("-", "_").replace(" ", "_")
    try:
        return Status(word)
    except ValueError:
        return _ALIASES.get(word)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def parse_reply(text: str) -> Outcome:
    """A codergen node's outcome from the model's final message.

    A reply that is (or ends its say with a fenced block holding) a JSON object with
    `outcome` (or `status`) sets the status, `preferred_label`, `suggested_next_ids`,
    `context_updates`, `notes` and `failure_reason`. Plain prose is SUCCESS. A status block
    whose outcome is not a status is a FAIL that says so: never a silent success."""
    doc = _status_block(text)
    if doc is None:
        return Outcome(Status.SUCCESS)
    said = next(doc[k] for k in STATUS_KEYS if k in doc)
    status = _status(said)
    if status is None:
        names = ", ".join(s.value for s in Status)
        why = f"the reply's status block says outcome {str(said)[:40]!r}: not one of {names}"
        return Outcome(Status.FAIL, failure_reason=why)
    updates = doc.get("context_updates")
    ids = doc.get("suggested_next_ids")
    return Outcome(
        status,
        preferred_label=_text(doc.get("preferred_label")),
        suggested_next_ids=tuple(i for i in ids if isinstance(i, str))
        if isinstance(ids, list)
        else (),
        context_updates={str(k): v for k, v in updates.items()}
        if isinstance(updates, dict)
        else {},
        notes=_text(doc.get("notes")),
        failure_reason=_text(doc.get("failure_reason")),
    )
