"""A hung Slurm controller under a real `deltad serve`: what the daemon's loop and the answers
written meanwhile go through (`deltad.testing.slurmoutage`, the e2e test's scenario, longer).

    .venv/bin/python bench/slurm_outage_bench.py [--pause 60] [--answers 3] [--out bench/results]

Needs root and Slurm's packages (`apt-get install slurm-wlm munge slurmctld slurmd`); the
cluster is `deltad.testing.slurmcluster` (a private network namespace, loopback only).

slurmctld is stopped with SIGSTOP for `--pause` seconds. The daemon runs with the systemd
watchdog on (WATCHDOG_USEC 1 s: a ping due every 0.5 s, sent at the end of a loop turn), so the
gaps between its pings bound how long any turn took meanwhile: a turn that waited on Slurm
would show as a gap of that length. Reported: those gaps (p50, p99, max) and the misses
(gaps over WATCHDOG_USEC), how many of the answers written during the outage the loop queued
while slurmctld was stopped, how long after SIGCONT each was ingested by its job (the periodic
full reconcile is out of reach: only the resumer's retry can resume them), and how often the
failure was logged.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deltad.testing import slurmoutage
from deltad.testing.slurmcluster import cluster
from tests.users import executable_by_all, shared_tmp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pause", type=float, default=60.0, help="seconds slurmctld is stopped")
    ap.add_argument("--answers", type=int, default=3, help="answers written during the outage")
    ap.add_argument("--watchdog", type=float, default=1.0, help="WATCHDOG_USEC, in seconds")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    with cluster() as c, executable_by_all(), shared_tmp() as shared:
        figures = slurmoutage.run(
            c, shared, args.pause, args.answers, watchdog_s=args.watchdog, deadline=300
        )
    row = {
        "bench": "slurm_outage",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["bench/slurm_outage_bench.py", *sys.argv[1:]]),
        **figures.summary(),
    }
    print(json.dumps(row, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    with open(args.out / f"slurm-outage-{stamp}.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
