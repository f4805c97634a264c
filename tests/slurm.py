"""A real one-node Slurm cluster for the Slurm executor's tests (session-scoped, per worker).

Skipped only where it cannot run: not root, no `unshare`/`nsenter`, or Slurm not installed
outside CI. With `CI=true` (`.ci/run` installs Slurm) a missing piece fails instead.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.support.slurmcluster import Cluster, cluster, missing_binaries


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root: starts slurmctld/slurmd and submits jobs as other users"
    tools = [t for t in ("unshare", "nsenter", "ip", "runuser") if shutil.which(t) is None]
    if tools:
        return f"needs {', '.join(tools)} for the cluster's private network namespace"
    missing = missing_binaries()
    if missing:
        return (
            f"Slurm is not installed (no {', '.join(missing)}): "
            "apt-get install slurm-wlm munge slurmctld slurmd (.ci/run does)"
        )
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    why = unavailable()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the Slurm tests must run in CI: {why}")
        pytest.skip(why)
    with cluster() as c:
        yield c


@pytest.fixture
def in_cluster(slurm_cluster: Cluster) -> Iterator[Cluster]:
    """The test's thread inside the cluster's network namespace (its subprocesses too)."""
    with slurm_cluster.entered():
        yield slurm_cluster
