"""A hung Slurm controller never stalls the daemon (`deltad.testing.slurmoutage`).

slurmctld is stopped with SIGSTOP for a few seconds under a real `deltad serve`: meanwhile the
daemon's loop goes on (every answer written then is queued, the systemd watchdog keeps being
fed), and once slurmctld answers again every one of those answers is resumed by the resumer's
own retry (the periodic full reconcile is out of reach), its failure said at most once. The
figures for a 60 s outage are bench/slurm_outage_bench.py's (docs/daemon.md quotes them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deltad.testing import slurmoutage
from deltad.testing.slurmcluster import Cluster
from tests.slurm import slurm_cluster  # noqa: F401
from tests.users import executable_by_all, shared_tmp


@pytest.fixture
def shared() -> Iterator[Path]:
    with shared_tmp() as d:
        yield d


@pytest.mark.timeout(300)
def test_a_hung_controller_stalls_nothing_and_its_answers_resume_when_it_is_back(
    slurm_cluster: Cluster,  # noqa: F811
    shared: Path,
) -> None:
    with executable_by_all():
        # The outage lasts longer than the watchdog allows a turn (an engine call in the loop
        # would be a miss); the watchdog itself is generous for a loaded machine.
        figures = slurmoutage.run(slurm_cluster, shared, pause=8.0, watchdog_s=6.0)
    assert figures.queued_during == figures.answered_during == 3  # the loop went on
    assert figures.ping_gaps_s and figures.watchdog_misses == 0, figures.summary()
    assert len(figures.resumed_after_s) == 3  # every answer of the outage resumed
    assert figures.periodic_reconciles == 0  # by the retry, not by the periodic reconcile
    assert figures.spawn_failed_logged <= 3  # at most once per workspace
