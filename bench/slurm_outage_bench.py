"""A Slurm controller away under a real `deltad serve`: what the daemon's loop and the answers
written meanwhile go through (`tests.support.slurmoutage`, the e2e test's scenario, longer).

    .venv/bin/python bench/slurm_outage_bench.py [--mode sigstop|stop] [--pause 60]
        [--answers 4] [--slots 8] [--out bench/results]

Needs root and Slurm's packages (`apt-get install slurm-wlm munge slurmctld slurmd`); the
cluster is `tests.support.slurmcluster` (a private network namespace, loopback only), here with
a node of `--slots` job slots (0: the tests' node, one job at a time) so that the jobs of the
outage's answers can start side by side, as on a cluster with room.

First, unless `--no-baseline`, the same span with slurmctld up and as many answers (the
loop's turns then are the baseline). Then slurmctld is hung (`--mode sigstop`) or stopped and
started again (`--mode stop`) for `--pause` seconds while answers arrive, every other one
through the HTTP inbox. Reported: the loop's turn
times meanwhile from its own histogram (`deltad_loop_turn_seconds` on /metrics: the share of
turns within 50 ms, exactly, and the edge under which 99 % fall), the status lines and the
watchdog pings it sent (WATCHDOG_USEC 1 s: gaps over it are misses), and for each answer of the
outage, from the moment slurmctld answered again: its job submitted (the daemon's part),
started (Slurm's scheduling, whole seconds), and the answer ingested; how many times each was
submitted and resumed; whether the periodic full reconcile (an hour away) played any part.
The load average is recorded at the start and the end (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import slurmoutage
from tests.support.slurmcluster import cluster
from tests.users import executable_by_all, shared_tmp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("sigstop", "stop"), default="sigstop")
    ap.add_argument("--pause", type=float, default=60.0, help="seconds slurmctld is away")
    ap.add_argument("--answers", type=int, default=4, help="answers written during the outage")
    ap.add_argument("--slots", type=int, default=8, help="jobs the node runs at once (0: one)")
    ap.add_argument(
        "--no-baseline", dest="baseline", action="store_false",
        help="skip the same span with slurmctld up, before the outage",
    )  # fmt: skip
    ap.add_argument("--watchdog", type=float, default=1.0, help="WATCHDOG_USEC, in seconds")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    load_before = os.getloadavg()
    with cluster(slots=args.slots or None) as c, executable_by_all(), shared_tmp() as shared:
        figures = slurmoutage.run(
            c,
            shared,
            args.pause,
            args.answers,
            watchdog_s=args.watchdog,
            deadline=300,
            mode=args.mode,
            baseline=args.baseline,
        )
    row = {
        "bench": "slurm_outage",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["bench/slurm_outage_bench.py", *sys.argv[1:]]),
        "cpus": os.cpu_count(),
        "slots": args.slots,
        "loadavg_start": [round(x, 2) for x in load_before],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        **figures.summary(),
    }
    print(json.dumps(row, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    with open(args.out / f"slurm-outage-{stamp}.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
