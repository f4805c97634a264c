"""Where everything lives in a workspace (the v1.2 layout).

<ws>/.delta/lock                               workspace lock (one driver at a time)
<ws>/.delta/interaction/request.json|response.txt
<ws>/.delta/interaction/live                   held open for writing by the driving `delta run`
<ws>/.delta/runs/LATEST                        plain file holding the newest run id
<ws>/.delta/runs/<RUN_ID>/execution/{journal.jsonl,metadata.json,engine.log}
<ws>/.delta/runs/<RUN_ID>/io/{invocations,tool_executions}/...
<ws>/.delta/runs/<RUN_ID>/secrets/              0700; one 0600 file per secret answer
<ws>/.delta/runs/<RUN_ID>/configuration/        snapshot of the agent at run start
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from . import safefs
from .errors import CorruptFile
from .fsio import atomic_write_text, read_regular_text
from .safefs import DELTA_DIR as DELTA_DIR  # defined there: safefs sits below this module
from .safefs import child

# The protocol's names inside `.delta/`, spelled here only (the daemon's watchers use them too).
RUNS_DIR = "runs"
INTERACTION_DIR = "interaction"
LATEST_FILE = "LATEST"
REQUEST_FILE = "request.json"
RESPONSE_TXT = "response.txt"
RESPONSE_JSON = "response.json"
LIVE_FILE = "live"  # held open by the driving client: its close is the watched mailbox's event
ANSWER_FILES = (RESPONSE_TXT, RESPONSE_JSON)
RUN_ID_RE = re.compile(r"^\d{8}_\d{6}_[0-9a-f]{6}$")

_T = TypeVar("_T")


class cached_path(Generic[_T]):  # lower case: a decorator, like cached_property
    """`functools.cached_property` without its lock (Python 3.11 takes an RLock on every
    first read, and a look derives about ten paths from a new `Workspace`). Two threads
    deriving the same path at once each store an equal value: nothing to serialise."""

    def __init__(self, derive: Callable[[Any], _T]) -> None:
        self.derive = derive
        self.name = derive.__name__
        self.__doc__ = derive.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> cached_path[_T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> _T | cached_path[_T]:
        if obj is None:
            return self
        # A non-data descriptor: once stored, the instance's own attribute is found first.
        value = obj.__dict__[self.name] = self.derive(obj)
        return value


def new_run_id(now: datetime | None = None) -> str:
    now = now or datetime.now()
    return f"{now:%Y%m%d_%H%M%S}_{secrets.token_hex(3)}"


@dataclass(frozen=True)
class RunPaths:
    dir: Path

    @property
    def run_id(self) -> str:
        return self.dir.name

    @cached_path
    def execution(self) -> Path:
        return child(self.dir, "execution")

    @property
    def journal(self) -> Path:
        return child(self.execution, "journal.jsonl")

    @property
    def metadata(self) -> Path:
        return child(self.execution, "metadata.json")

    @property
    def engine_log(self) -> Path:
        return self.execution / "engine.log"

    @property
    def invocations(self) -> Path:
        return self.dir / "io" / "invocations"

    @property
    def tool_executions(self) -> Path:
        return self.dir / "io" / "tool_executions"

    @property
    def secrets(self) -> Path:
        return self.dir / "secrets"

    @property
    def configuration(self) -> Path:
        return self.dir / "configuration"


@dataclass(frozen=True)
class Workspace:
    root: Path

    @classmethod
    def at(cls, path: str | Path) -> Workspace:
        root = Path(path).absolute()
        if DELTA_DIR in root.parts:
            raise CorruptFile(f"{root} is inside a .delta/ directory; that cannot be a workspace")
        return cls(root)

    # Paths are derived once per instance (the daemon reads ~20 per workspace per reconcile),
    # joined without parsing the name again (`safefs.child`).
    @cached_path
    def delta_dir(self) -> Path:
        return child(self.root, DELTA_DIR)

    @cached_path
    def runs_dir(self) -> Path:
        return child(self.delta_dir, RUNS_DIR)

    @cached_path
    def latest_file(self) -> Path:
        return child(self.runs_dir, LATEST_FILE)

    @cached_path
    def lock_file(self) -> Path:
        return child(self.delta_dir, "lock")

    @cached_path
    def interaction_dir(self) -> Path:
        return child(self.delta_dir, INTERACTION_DIR)

    @cached_path
    def live_file(self) -> Path:
        return child(self.interaction_dir, LIVE_FILE)

    @cached_path
    def request_file(self) -> Path:
        return child(self.interaction_dir, REQUEST_FILE)

    @cached_path
    def response_file(self) -> Path:
        return child(self.interaction_dir, RESPONSE_TXT)

    @cached_path
    def response_json(self) -> Path:
        return child(self.interaction_dir, RESPONSE_JSON)

    def run(self, run_id: str) -> RunPaths:
        if not RUN_ID_RE.match(run_id):
            raise CorruptFile(f"{run_id!r} is not a run id (expected YYYYMMDD_HHMMSS_xxxxxx)")
        return RunPaths(self.runs_dir / run_id)

    def latest_run_id(self) -> str | None:
        try:
            text = read_regular_text(self.latest_file, limit=4096).strip()
        except FileNotFoundError:
            return None
        if not RUN_ID_RE.match(text):
            raise CorruptFile(f"{self.latest_file} does not hold a run id: {text[:60]!r}")
        return text

    def set_latest(self, run_id: str) -> None:
        atomic_write_text(self.latest_file, run_id)

    def run_ids(self) -> list[str]:
        return sorted(n for n in safefs.listdir(self.runs_dir) if RUN_ID_RE.match(n))


def question_files(workspace: Path, run_id: str) -> tuple[str, str, str] | None:
    """What a question's document is read from, as plain strings for a stat each: the
    request, the mailbox directory (an answer or a refusal note changes it) and the run's
    metadata; None if `run_id` is not a run id. For a cache's staleness check, made for every
    item of a list page: string joins, no path objects (those cost more than the stats)."""
    if not RUN_ID_RE.match(run_id):
        return None
    delta = f"{workspace}/{safefs.DELTA_DIR}"
    mailbox = f"{delta}/{INTERACTION_DIR}"
    return (
        f"{mailbox}/{REQUEST_FILE}",
        mailbox,
        f"{delta}/{RUNS_DIR}/{run_id}/execution/metadata.json",
    )
