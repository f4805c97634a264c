"""`deltad.testing.executor_contract` over `executor: slurm` on the real one-node cluster.

Jobs run as a real unprivileged user in workspaces on a directory every user can traverse; the
outage is slurmctld stopped with SIGSTOP (a hung controller), and an ended job is still listed
by Slurm (MinJobAge), so the adopt-after-an-end check runs too.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from deltad.executors import Identity, JobExecutor
from deltad.executors.slurm import make_slurm_executor
from deltad.testing.executor_contract import ExecutorContract
from tests.slurm import in_cluster, slurm_cluster  # noqa: F401
from tests.support.slurmcluster import Cluster
from tests.users import User, accounts, shared_tmp

_ids = itertools.count()


@pytest.fixture(scope="module")
def owner() -> Iterator[User]:
    with accounts() as a:
        yield a.user()


class TestSlurm(ExecutorContract):
    name = "slurm"
    bad_options: ClassVar[list[Mapping[str, Any]]] = [
        {},  # log_dir is required
        {"log_dir": "/l", "bogus": 1},
        {"log_dir": "/l", "extra_args": ["--job-name=mine"]},  # the one name is the daemon's
    ]
    keeps_ended = True

    @pytest.fixture(autouse=True)
    def _cluster(
        self,
        in_cluster: Cluster,  # noqa: F811
        owner: User,
    ) -> Iterator[None]:
        self.c, self.owner = in_cluster, owner
        self.daemon_id = f"c{os.getpid()}-{next(_ids)}"
        with shared_tmp() as shared:
            self.shared = shared
            yield
            out = in_cluster.run("squeue", "-h", "--states=all", "-O", "JobID:|,Comment:0")
            for line in out.stdout.splitlines():
                job, _, comment = line.partition("|")
                if f":{self.daemon_id}:" in comment:
                    in_cluster.run("scancel", "--signal=KILL", "--full", job.strip(), check=False)

    def make(self, state_dir: Path) -> JobExecutor:
        options = {
            "log_dir": str(self.shared / "logs"),
            "slurm_conf": str(self.c.conf),
            "daemon_id": self.daemon_id,
            "poll_every": 0.2,
        }
        return make_slurm_executor.build(options, state_dir)

    def workspace(self, tmp_path: Path) -> Path:
        ws = self.shared / f"ws{next(_ids)}"
        ws.mkdir()
        os.chown(ws, self.owner.uid, self.owner.gid)
        return ws

    def identity(self) -> Identity:
        return Identity(self.owner.uid, self.owner.gid, user=self.owner.name)

    def outage(self, executor: JobExecutor) -> contextlib.AbstractContextManager[None]:
        return self.c.paused()
