"""`deltad.testing.executor_contract` over `executor: kubernetes` against kmock's API server.

The test kubelet (tests/kube.py) plays the node: it runs each Job's command as the pod's user
in the workspace and reports the pod's exit. The outage is the API server hung behind a proxy
that takes connections and answers nothing (tests/kube.py `HangingProxy`).
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
from deltad.executors.kubernetes import make_kubernetes_executor
from deltad.testing.executor_contract import ExecutorContract
from tests.kube import HangingProxy, Kubelet, emulator
from tests.users import User, accounts, shared_tmp

_ids = itertools.count()


@pytest.fixture(scope="module")
def owner() -> Iterator[User]:
    with accounts() as a:
        yield a.user()


class TestKubernetes(ExecutorContract):
    name = "kubernetes"
    bad_options: ClassVar[list[Mapping[str, Any]]] = [
        {},  # image, pvc and mount_path are required
        {"image": "i", "pvc": "p", "mount_path": "/srv", "bogus": 1},
        {"image": "i", "pvc": "p", "mount_path": "relative"},
    ]
    keeps_ended = True
    deadline = 60.0

    @pytest.fixture(autouse=True)
    def _api(self, owner: User) -> Iterator[None]:
        self.owner = owner
        with shared_tmp() as shared, emulator(shared) as emu:
            self.shared, self.emu = shared, emu
            self.root = shared / "root"
            self.root.mkdir()
            self.proxy = HangingProxy(emu, shared)
            try:
                with Kubelet(emu, shared / "pods.log"):
                    yield
            finally:
                self.proxy.close()

    def make(self, state_dir: Path) -> JobExecutor:
        options = {
            "image": "deltad:test",
            "pvc": "workspaces",
            "mount_path": str(self.root),
            "kubeconfig": str(self.proxy.kubeconfig),
            "poll_every": 0.2,
            "request_timeout": 30,
            "cancel_grace": 5,
        }
        return make_kubernetes_executor.build(options, state_dir)

    def workspace(self, tmp_path: Path) -> Path:
        ws = self.root / f"ws{next(_ids)}"
        ws.mkdir()
        os.chown(ws, self.owner.uid, self.owner.gid)
        return ws

    def identity(self) -> Identity:
        return Identity(self.owner.uid, self.owner.gid)

    def outage(self, executor: JobExecutor) -> contextlib.AbstractContextManager[None]:
        return self.proxy.hung()
