"""Two daemons on one fleet (a script, not a timed test): active + standby, kill -9 mid-way.

    .venv/bin/python bench/ha_bench.py                    # 200 answers, kill -9 after 100
    .venv/bin/python bench/ha_bench.py --answers 40 --kill-after 20

Two real `deltad serve` share one root of N paused workspaces, one state dir and one lease
(`ha.lease`, default `poll_seconds`); resumes are the stub client (`deltad/testing/stub.py`),
which appends one line per answer it ingests. The first half of the answers is written, and
once `--kill-after` of them have been resumed the active daemon is killed with SIGKILL (its
in-flight resumes go on, in their own sessions); the other half is written at once, in the gap.
Measured: kill → the standby holds the lease (`lease_taken`), kill → it is ready (its startup
reconcile done), kill → every answer resumed; and whether each answer was ingested exactly once
(no answer resumed twice, none lost). Results: Markdown on stdout, JSON in bench/results/.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import signal
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.support.daemon import (  # noqa: E402
    Daemon,
    answer,
    paused_workspace,
    records,
    stub_command,
    wait_for,
)

DEADLINE = 600.0  # generous: a guard against hangs, not a threshold


def _stamp(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def pair(work: Path, root: Path) -> tuple[Daemon, Daemon, Path]:
    shared = work / "shared"
    record = work / "resumes.jsonl"
    common: dict[str, Any] = {
        "state_dir": str(shared / "state"),
        "ha": {"lease": str(shared / "deltad.lease")},
        "log_level": "info",
        "resume_command": stub_command(record),
    }
    daemons = []
    for name in ("a", "b"):
        (work / name).mkdir()
        d = Daemon(work / name, [root], **common)
        d.record = record
        daemons.append(d)
    return daemons[0], daemons[1], record


def bench(answers: int, kill_after: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="ha-bench-"))
    root = work / "root"
    spaces = [root / f"ws{i:04d}" for i in range(answers)]
    for ws in spaces:
        paused_workspace(ws)
    active, standby, record = pair(work, root)
    active.start()
    standby.start(wait=False)
    try:
        standby.wait_event("standby", timeout=DEADLINE)
        first, rest = spaces[: answers // 2], spaces[answers // 2 :]
        t0 = time.time()
        for ws in first:
            answer(ws, ws.name)
        wait_for(lambda: len(records(record)) >= kill_after, "the first resumes", DEADLINE)
        killed_at = time.time()
        active.signal(signal.SIGKILL)
        assert active.proc is not None
        active.proc.wait(DEADLINE)
        for ws in rest:
            answer(ws, ws.name)
        [taken] = standby.wait_event("lease_taken", timeout=DEADLINE)
        [ready] = standby.wait_event("daemon_ready", timeout=DEADLINE)
        wait_for(lambda: len({r["workspace"] for r in records(record)}) >= answers, "all", DEADLINE)
        all_done = max(r["t"] for r in records(record))
        time.sleep(2.0)  # a settle for late duplicates to show up in the count (not a sync)
        done = records(record)
    finally:
        for d in (active, standby):
            with contextlib.suppress(Exception):
                d.stop()
            d.kill_children()
    per_ws = collections.Counter(r["workspace"] for r in done)
    spawned_a = len(active.events("resume_spawned"))
    spawned_b = len(standby.events("resume_spawned"))
    return {
        "answers": answers,
        "kill_after_resumed": kill_after,
        "resumed_before_kill": len([r for r in done if r["t"] <= killed_at]),
        "answers_ingested": len(done),
        "workspaces_resumed_twice": sum(1 for n in per_ws.values() if n > 1),
        "workspaces_never_resumed": answers - len(per_ws),
        "resumes_started": {
            "active": spawned_a,
            "standby": spawned_b,
            "total": spawned_a + spawned_b,
        },
        "adopted_by_standby": len(standby.events("resume_adopted")),
        "kill_to_lease_s": round(_stamp(taken["timestamp"]) - killed_at, 3),
        "kill_to_ready_s": round(_stamp(ready["timestamp"]) - killed_at, 3),
        "kill_to_all_resumed_s": round(all_done - killed_at, 3),
        "first_answer_to_all_resumed_s": round(all_done - t0, 3),
        "lease_waited_ms": taken["waited_ms"],
    }


def markdown(r: dict[str, Any]) -> str:
    s = r["resumes_started"]
    return "\n".join(
        [
            f"## Active/standby, {r['answers']} answers, kill -9 of the active mid-way",
            "",
            "| measure | value |",
            "| --- | --- |",
            f"| answers ingested (stub records) | {r['answers_ingested']} |",
            f"| workspaces resumed twice / never | {r['workspaces_resumed_twice']} / "
            f"{r['workspaces_never_resumed']} |",
            f"| resumes started: active / standby / total | {s['active']} / {s['standby']} / "
            f"{s['total']} |",
            f"| resumed before the kill | {r['resumed_before_kill']} |",
            f"| in-flight resumes adopted by the new active | {r['adopted_by_standby']} |",
            f"| kill -9 → lease taken | {r['kill_to_lease_s']} s |",
            f"| kill -9 → new active ready (reconciled) | {r['kill_to_ready_s']} s |",
            f"| kill -9 → every answer resumed | {r['kill_to_all_resumed_s']} s |",
            "",
        ]
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--answers", type=int, default=200)
    ap.add_argument("--kill-after", type=int, default=None, help="resumed before the kill")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    kill_after = args.kill_after if args.kill_after is not None else args.answers // 4
    result = bench(args.answers, kill_after)
    stamp = datetime.now().strftime("%Y%m%dT%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"ha-{stamp}.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (args.out / f"ha-{stamp}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
