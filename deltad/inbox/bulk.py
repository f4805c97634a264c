"""Many questions, one answer: what makes two questions answerable alike (`shape`), and where
questions wait under a directory (`waiting_under`, for `delta respond --all-under`). Each
question is still answered on its own through `submit`: one answer, many checks."""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Iterator
from pathlib import Path

from deltad.protocol import InteractionRequest, kinds
from deltad.protocol.layout import DELTA_DIR, INTERACTION_DIR, REQUEST_FILE


def shape(req: InteractionRequest) -> str:
    """The kind, its own fields (options, range, ...) and the gated calls' tools: questions of
    one shape take one answer the same way (a choice's `p` is the same pear everywhere)."""
    tools = sorted(c.tool_name for c in req.calls)
    own = kinds.question_fields(req)
    return json.dumps([str(req.input_type), own, tools], sort_keys=True, default=str)


def waiting_under(root: Path, only: str | None = None) -> Iterator[Path]:
    """Each workspace under `root` (itself included) with a question file, in name order;
    `only` (a glob) keeps those whose path matches. Symlinks are not followed, `.delta/` not
    entered."""
    for here, dirs, _files in os.walk(root):
        dirs.sort()
        if DELTA_DIR in dirs:
            dirs.remove(DELTA_DIR)
            ws = Path(here)
            asked = ws / DELTA_DIR / INTERACTION_DIR / REQUEST_FILE
            if os.path.lexists(asked) and (only is None or fnmatch.fnmatch(str(ws), only)):
                yield ws
