"""A computation that costs an interpreter seconds, run beside the test session rather than in
it: started when the module that needs it is collected, read when its test runs. Run serially
(`pytest tests/unit`), the layer keeps one core busy and the child takes the other, so its
seconds leave the layer's wall time; under xdist every worker collects every module, so there it
starts only when its test asks (once per worker that runs one, as before)."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent


class Beside:
    """`python -c code` from the repository's root; `result()` is what it printed, as JSON."""

    def __init__(self, code: str) -> None:
        self.code = code
        self._proc: subprocess.Popen[str] | None = None
        if "PYTEST_XDIST_WORKER" not in os.environ:
            self._proc = self._start()
            atexit.register(self._proc.kill)  # deselected: never read, never left behind

    def _start(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", self.code],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def result(self) -> Any:
        proc = self._proc or self._start()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"the child failed: {err[-2000:]}"
        return json.loads(out)
