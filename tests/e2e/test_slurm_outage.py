"""A Slurm controller away never stalls the daemon (`tests.support.slurmoutage`).

slurmctld is hung (SIGSTOP) or stopped (SIGTERM, started again after) for a few seconds under a
real `deltad serve`: meanwhile the daemon's loop goes on (every answer written then is queued,
two of them taken by the HTTP inbox, status lines and the systemd watchdog keep coming, the
loop-turn histogram on /metrics keeps counting), and once slurmctld answers again every one of
those answers is submitted exactly once and resumed exactly once, by the resumer's own retry:
the periodic full reconcile is an hour away, so none of them was left to it. No timing is
asserted here; the figures for a 60 s outage are bench/slurm_outage_bench.py's (docs/daemon.md
quotes them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm import slurm_cluster  # noqa: F401
from tests.support import slurmoutage
from tests.support.slurmcluster import Cluster
from tests.users import executable_by_all, shared_tmp


@pytest.fixture
def shared() -> Iterator[Path]:
    with shared_tmp() as d:
        yield d


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("mode", "pause"),
    [
        # Hung longer than the watchdog allows a turn: an engine call in the loop would be a
        # miss (the watchdog itself is generous for a loaded machine).
        ("sigstop", 8.0),
        # Stopped: its port refuses, every Slurm command fails; a short stop is enough.
        ("stop", 3.0),
    ],
)
def test_a_controller_away_stalls_nothing_and_its_answers_resume_once_when_it_is_back(
    slurm_cluster: Cluster,  # noqa: F811
    shared: Path,
    mode: slurmoutage.Mode,
    pause: float,
) -> None:
    with executable_by_all():
        f = slurmoutage.run(
            slurm_cluster, shared, pause=pause, watchdog_s=6.0, mode=mode, rescan_s=3600.0
        )
    summary = f.summary()
    # The loop went on: each answer queued (two taken by the inbox with 202), turns counted,
    # status lines sent, the watchdog fed.
    assert f.queued_during == f.answered_during == 3 and f.answered_over_http == 2, summary
    assert f.turns.count > 0 and f.turns_cpu.count > 0 and f.statuses_during > 0, summary
    assert f.ping_gaps_s and f.watchdog_misses == 0, summary
    # Once it is back: each answer's job submitted once, each answer ingested once, by the
    # resumer's retry (the periodic full reconcile, an hour away, never ran).
    assert f.submits == dict.fromkeys(f.submits, 1) and len(f.submits) == 3, summary
    assert f.resumes == dict.fromkeys(f.resumes, 1) and len(f.resumes) == 3, summary
    assert f.periodic_reconciles == 0, summary
    assert f.spawn_failed_logged == 0, summary  # the engine's absence is the worker's to say
