"""One platform switch (deltad/platform.py): with `DELTAD_PLATFORM=other` every Linux-only
piece is hidden, and deltad still imports, chooses its fallbacks and passes its unit layer.

`.ci/run` runs the whole unit layer so; here a representative part, in a subprocess (the
switch is read once, at import)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OTHER = {**os.environ, "DELTAD_PLATFORM": "other"}

FALLBACKS = """
import os, deltad.core.service, deltad.http.app, deltad.client.cli
from deltad import platform
from deltad.core.config import DaemonConfig
from deltad.executors import resolve
from deltad.executors.registry import check_options
from deltad.protocol.process import alive, current_owner
assert not platform.LINUX
r, w = platform.nonblocking_pipe()
assert not os.get_blocking(r) and not os.get_inheritable(w)
assert platform.pidfd_open(os.getpid()) is None and platform.read_lease_free(r) is None
config = DaemonConfig.model_validate({"roots": [%(root)r], "state_dir": %(root)r})
assert config.roots[0].backend == "watchdog"
assert resolve("auto", [%(delta)r, "run"]) == "fresh"
try:
    check_options("fork", {})
except ValueError as e:
    assert "needs Linux" in str(e)
else:
    raise AssertionError("fork without Linux")
assert alive(os.getpid(), None) and current_owner().start_ticks is None
print("ok")
"""


def test_without_linux_deltad_imports_and_falls_back(tmp_path: Path) -> None:
    delta = str(Path(sys.executable).parent / "delta")
    code = FALLBACKS % {"root": str(tmp_path), "delta": delta}
    out = subprocess.run(
        [sys.executable, "-c", code], env=OTHER, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_unit_layer_passes_without_linux() -> None:
    part = [
        "tests/unit/test_executor_registry.py",
        "tests/unit/test_executors.py",
        "tests/unit/test_daemon_slots.py",
        "tests/unit/test_daemon_parts.py",
        "tests/unit/test_runfacts.py",
        "tests/unit/test_kind_date.py",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-q", "-p", "no:cacheprovider", *part],
        cwd=REPO,
        env=OTHER,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:]
    assert "skipped" in out.stdout  # the Linux-only tests were seen and left out
