"""Real, throw-away Unix users and groups for the multi-user tests (they need root).

Tests that switch users need a Python and a `delta` that other users can execute. The venv's
interpreter may live under a directory only root may enter (/root/.pyenv): `executable_by_all`
grants traverse (o+x, never read) on the directories in the way. A real deployment installs
deltad where owners can run it (/opt).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

_counter = itertools.count()


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: creates users and runs processes as them")


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int

    def argv(self, *cmd: str, umask: str | None = None) -> list[str]:
        """Run `cmd` as this user with its groups (setpriv, so no PAM or tty is involved)."""
        inner = list(cmd)
        if umask is not None:
            inner = ["sh", "-c", f'umask {umask}; exec "$@"', "sh", *cmd]
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--init-groups",
            "--reset-env",
            *inner,
        ]


class Accounts:
    """Creates users and groups with unique names; removes them on close."""

    def __init__(self) -> None:
        self.users: list[str] = []
        self.groups: list[str] = []
        self.tag = f"dt{os.getpid() % 10000}"

    def group(self) -> str:
        name = f"{self.tag}g{next(_counter)}"
        subprocess.run(["groupadd", name], check=True)
        self.groups.append(name)
        return name

    def user(self, *groups: str) -> User:
        name = f"{self.tag}u{next(_counter)}"
        cmd = ["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/bin/sh"]
        if groups:
            cmd += ["--groups", ",".join(groups)]
        subprocess.run([*cmd, name], check=True)
        self.users.append(name)
        pw = pwd.getpwnam(name)
        return User(name, pw.pw_uid, pw.pw_gid)

    def close(self) -> None:
        for name in self.users:
            subprocess.run(["userdel", name], check=False, capture_output=True)
        for name in self.groups:
            subprocess.run(["groupdel", name], check=False, capture_output=True)


@contextlib.contextmanager
def accounts() -> Iterator[Accounts]:
    need_root()
    a = Accounts()
    try:
        yield a
    finally:
        a.close()


@contextlib.contextmanager
def executable_by_all() -> Iterator[None]:
    """Let other users run this venv's interpreter: o+x (traverse only, never read) on each
    ancestor lacking it. Left in place: test processes run in parallel, and one putting a
    mode back would pull the interpreter from under another's users mid-test."""
    real = Path(os.path.realpath(sys.executable))
    for d in [*reversed(real.parents), *reversed(Path(sys.prefix).parents), Path(sys.prefix)]:
        mode = os.stat(d).st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(d, stat.S_IMODE(mode) | stat.S_IXOTH)
    yield


@contextlib.contextmanager
def shared_tmp() -> Iterator[Path]:
    """A directory every user can traverse (pytest's own tmp dirs are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="deltad-users-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def chown_tree(path: Path, user: User, group: int | None = None) -> None:
    for p in [path, *path.rglob("*")]:
        os.lchown(p, user.uid, user.gid if group is None else group)
