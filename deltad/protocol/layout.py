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
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path

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


def new_run_id(now: datetime | None = None) -> str:
    now = now or datetime.now()
    return f"{now:%Y%m%d_%H%M%S}_{secrets.token_hex(3)}"


@dataclass(frozen=True)
class RunPaths:
    dir: Path

    @property
    def run_id(self) -> str:
        return self.dir.name

    @cached_property
    def execution(self) -> Path:
        return self.dir / "execution"

    @property
    def journal(self) -> Path:
        return self.execution / "journal.jsonl"

    @property
    def metadata(self) -> Path:
        return self.execution / "metadata.json"

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
    @cached_property
    def delta_dir(self) -> Path:
        return child(self.root, DELTA_DIR)

    @cached_property
    def runs_dir(self) -> Path:
        return child(self.delta_dir, RUNS_DIR)

    @cached_property
    def latest_file(self) -> Path:
        return child(self.runs_dir, LATEST_FILE)

    @cached_property
    def lock_file(self) -> Path:
        return child(self.delta_dir, "lock")

    @cached_property
    def interaction_dir(self) -> Path:
        return child(self.delta_dir, INTERACTION_DIR)

    @cached_property
    def live_file(self) -> Path:
        return child(self.interaction_dir, LIVE_FILE)

    @cached_property
    def request_file(self) -> Path:
        return child(self.interaction_dir, REQUEST_FILE)

    @cached_property
    def response_file(self) -> Path:
        return child(self.interaction_dir, RESPONSE_TXT)

    @cached_property
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
