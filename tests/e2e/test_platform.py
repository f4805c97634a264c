"""deltad imports without the Linux-only inotify_simple: the watchdog backend is what other
platforms get, and nothing else may need inotify to import."""

from __future__ import annotations

import subprocess
import sys

HIDE_INOTIFY = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "inotify_simple" or name.startswith("inotify_simple."):
            raise ImportError("no inotify_simple on this platform")
sys.meta_path.insert(0, Hide())
import deltad.core.cli, deltad.core.service, deltad.watch.watchdog_observer
from deltad.watch import event_backend, PollingBackend
from deltad.watch.hints import HintQueue
q = HintQueue()
b = event_backend("watchdog", q, PollingBackend(q, 1.0), None)
b.close()
try:
    event_backend("inotify", q, PollingBackend(q, 1.0), None)
except ImportError as e:
    print("inotify refused:", e)
print("ok")
"""


def test_deltad_imports_with_inotify_simple_absent() -> None:
    p = subprocess.run([sys.executable, "-c", HIDE_INOTIFY], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "inotify refused" in p.stdout and p.stdout.strip().endswith("ok")
