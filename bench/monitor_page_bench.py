"""The core's CPU for one list page as the monitor answers the inbox's call: 1,000 stub-paused
questions, `list_requests` with limit=1000 decoded and answered into its reply frame (the
document cache warm), against the code at another commit, runs alternating.

    git archive eb6d08f | (mkdir -p /tmp/deltad-old && tar -x -C /tmp/deltad-old)
    .venv/bin/python bench/monitor_page_bench.py --old /tmp/deltad-old        # ~1 min

Each run is a fresh interpreter (PYTHONPATH picks the code); `time.process_time()` around each
of 30 calls, so a loaded machine's waiting is not counted. Prints the median and the fastest.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

ONE_RUN = r"""
import statistics, sys, tempfile, time
from pathlib import Path
from deltad.inbox.config import HttpConfig
from deltad.inbox.feed import Feed, View
from deltad.inbox.tokens import TokenStore
from deltad import wire
from deltad.testing.stub import paused_workspace
try:  # the operation table (deltad/inbox/ops.py)
    from deltad.inbox.context import Context
    from deltad.privsep import monitor
    CALL = wire.Call(op="list_requests", id=1, token="a", args={"limit": 1000})
    def answer(ctx):
        return monitor.reply_to(ctx, None, monitor.decode(wire.encode(CALL)[4:]))
except ImportError:  # before it: a frame model per operation
    from deltad.inbox.handlers import Context
    from deltad.privsep import core
    def answer(ctx):
        raw = b'{"op": "list_requests", "id": 1, "token": "a", "limit": 1000}'
        return core.reply_to(ctx, core.decode(raw))
work = Path(tempfile.mkdtemp(prefix="deltad-page-bench-"))
feed = Feed()
options = [{"key": "a", "label": "A"}, {"key": "b", "label": "B"}]
for i in range(1000):
    ws = work / "root" / f"ws{i:04}"
    run = paused_workspace(ws, f"q {i}?", input_type="choice", options=options, request_id=f"r{i}")
    feed.index.put(View(ws, "waiting", run, "WAITING_FOR_INPUT", f"r{i}", "choice", float(i)))
tokens = TokenStore(work / "state")
tokens.add("a", [], "admin")
ctx = Context(feed, tokens, HttpConfig(), b"k" * 32)
frame = answer(ctx)  # fills the document cache
assert b'"r999"' in frame
cpu = []
for _ in range(30):
    t = time.process_time()
    answer(ctx)
    cpu.append(time.process_time() - t)
print(f"{statistics.median(cpu) * 1000:.1f} {min(cpu) * 1000:.1f} {len(frame)}")
"""


def run(pythonpath: str | None) -> str:
    env = {**os.environ, "PYTHONPATH": pythonpath or str(HERE.parent)}
    done = subprocess.run(
        [sys.executable, "-c", ONE_RUN],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
        cwd="/",
    )
    return done.stdout.strip().splitlines()[-1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--old", help="a checkout of the code to compare with")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    for _ in range(args.rounds):
        for label, path in (("this", None), ("old", args.old)):
            if label == "old" and path is None:
                continue
            median, fastest, size = run(path).split()
            load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
            print(f"{label:5} cpu median {median} ms, fastest {fastest} ms, frame {size} bytes"
                  f" (load {load})")  # fmt: skip


if __name__ == "__main__":
    main()
