"""Answer → resume over HTTP, split (the inbox in its own unprivileged process, every answer a
call to the core over the Unix socket) against the inbox in the daemon's process (the code
before the split), side by side on the same machine, rounds interleaved.

    git archive d8e5773 | (mkdir -p /tmp/deltad-old && tar -x -C /tmp/deltad-old)
    .venv/bin/python bench/privsep_bench.py --old /tmp/deltad-old        # ~2 min

Each contender is a real `deltad serve --listen` (as root here: the split one runs its inbox
as deltad-inbox) over W stub-paused workspaces with the stub resume. A sample: a fresh question
in one workspace, seen by `GET /v1/requests/{id}` (200), then the clock starts, the answer is
POSTed (its 202 is `post`), and the clock stops when the stub resume has recorded its run
(`resume`: the record file is polled every millisecond). Rounds alternate between the
contenders (the machine is shared: its load average is recorded around each round). Written
to bench/results/privsep-<time>.json; the ratio split/old of the medians is what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from deltad.testing.stub import paused_workspace  # noqa: E402
from tests.support.daemon import DELTAD, Daemon, records, wait_for  # noqa: E402
from tests.support.inbox import http_url  # noqa: E402


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Contender:
    def __init__(self, label: str, work: Path, workspaces: int, pythonpath: str | None) -> None:
        self.label = label
        self.root = work / "root"
        self.spaces = [self.root / f"ws{i:03}" for i in range(workspaces)]
        for ws in self.spaces:
            paused_workspace(ws, prompt=f"{ws.name}?")
        self.daemon = Daemon(
            work, [self.root], http={"listen": "127.0.0.1:0"}, log_level="info", settle_seconds=0.2
        )
        self.daemon.start(env={"PYTHONPATH": pythonpath} if pythonpath else {})
        self.url = http_url(self.daemon)
        # With the contender's own `deltad token` (the old code keeps tokens.json elsewhere).
        argv = [DELTAD, "token", "add", "bench", "--state-dir", str(self.daemon.state_dir)]
        env = {**os.environ, **({"PYTHONPATH": pythonpath} if pythonpath else {})}
        made = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        token = made.stdout.strip().splitlines()[-1]
        self.http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        )
        self.samples: list[dict[str, float]] = []
        self.next = 0

    def sample(self) -> None:
        ws = self.spaces[self.next % len(self.spaces)]
        self.next += 1
        resumed = len(self.daemon.resumed(ws))
        wait_for(lambda: not (ws / ".delta/interaction/response.json").exists(), "consumed")
        paused_workspace(ws, prompt=f"{ws.name} again?")
        rid = json.loads((ws / ".delta/interaction/request.json").read_text())["request_id"]
        wait_for(lambda: self.http.get(f"/v1/requests/{rid}").status_code == 200, "listed")
        t0 = time.perf_counter()
        r = self.http.post(f"/v1/requests/{rid}/answer", json={"answer": "y"})
        post = time.perf_counter() - t0
        assert r.status_code == 202, r.text
        deadline = t0 + 60
        while len(records_for(self.daemon, ws)) <= resumed:
            if time.perf_counter() > deadline:
                raise AssertionError(f"{ws} was not resumed")
            time.sleep(0.001)
        resume = time.perf_counter() - t0
        self.samples.append({"post_ms": 1000 * post, "resume_ms": 1000 * resume})

    def stop(self) -> None:
        self.http.close()
        self.daemon.stop(timeout=120)
        self.daemon.kill_children()

    def summary(self) -> dict[str, Any]:
        post = [s["post_ms"] for s in self.samples]
        resume = [s["resume_ms"] for s in self.samples]
        q = statistics.quantiles
        return {
            "contender": self.label,
            "samples": len(self.samples),
            "post_p50_ms": statistics.median(post),
            "post_p90_ms": q(post, n=10)[-1],
            "resume_p50_ms": statistics.median(resume),
            "resume_p90_ms": q(resume, n=10)[-1],
            "resume_mean_ms": statistics.fmean(resume),
        }


def records_for(d: Daemon, ws: Path) -> list[dict[str, Any]]:
    return [r for r in records(d.record) if r.get("workspace") == str(ws)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--old", required=True, help="a checkout of the code before the split")
    ap.add_argument("--workspaces", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--work", type=Path, default=Path("/tmp/deltad-privsep-bench"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("note: not root: the split inbox runs as this same user", file=sys.stderr)
    stamp = datetime.now().strftime("%Y%m%dT%H%M%S")
    out = HERE / "results" / f"privsep-{stamp}.json"
    split = Contender("split", args.work / f"split-{stamp}", args.workspaces, None)
    old = Contender("in-process", args.work / f"old-{stamp}", args.workspaces, args.old)
    loads: list[dict[str, Any]] = []
    try:
        for c in (split, old):  # one warm-up answer each, not counted
            c.sample()
            c.samples.clear()
        for r in range(args.rounds):
            order = (split, old) if r % 2 == 0 else (old, split)
            for c in order:
                before = loadavg()
                for _ in range(args.per_round):
                    c.sample()
                after = loadavg()
                loads.append({"round": r, "contender": c.label, "before": before, "after": after})
    finally:
        split.stop()
        old.stop()
    # The contenders are what they say: only the split one started an inbox process.
    assert split.daemon.events("inbox_started") and not old.daemon.events("inbox_started")
    a, b = split.summary(), old.summary()
    doc = {
        "bench": "privsep answer->resume over HTTP",
        "at": stamp,
        "old": args.old,
        "workspaces": args.workspaces,
        "settle_seconds": 0.2,
        "results": [a, b],
        "ratio_resume_p50": a["resume_p50_ms"] / b["resume_p50_ms"],
        "ratio_resume_mean": a["resume_mean_ms"] / b["resume_mean_ms"],
        "ratio_post_p50": a["post_p50_ms"] / b["post_p50_ms"],
        "loadavg": loads,
    }
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "loadavg"}, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
